"""Tests of `oodbench run` (src/oodbench/runner/)."""
