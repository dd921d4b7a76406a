"""Tests of oodbench.zeroshot (a package, so that helpers import relatively and file names need no prefix)."""
