"""The `oodbench` command: assembles each area's commands (`oodbench.<area>.cli`) into one application."""

from .main import OodbenchGroup, app, main

__all__ = ["OodbenchGroup", "app", "main"]
