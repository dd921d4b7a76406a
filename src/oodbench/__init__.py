"""oodbench: out-of-distribution detection research at ImageNet scale."""
__version__ = "0.1.0"
