"""Extraction engines: `local` (DataLoader workers) and `ray` (Ray Data + actors); same batches, same arrays."""
