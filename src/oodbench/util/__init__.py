"""Plumbing shared by every layer: atomic writes, chunking, lazy imports, progress, terminal output, CLI parameters.

These modules import nothing else of oodbench.
"""
