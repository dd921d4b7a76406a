"""Backbones turning preprocessed image batches into per-image arrays."""
