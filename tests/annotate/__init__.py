"""Tests of the annotation app and benchmark construction (package `oodbench.annotate`)."""
