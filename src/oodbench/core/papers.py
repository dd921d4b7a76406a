"""The reference record of a method (detector or zero-shot score): citation, venue, URL."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Paper"]


@dataclass(frozen=True)
class Paper:
    """Reference for a method: short citation, venue/year and a URL."""

    citation: str
    venue: str
    url: str
    notes: str = ""
