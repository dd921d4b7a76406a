"""How many CPU cores this process may use."""

from __future__ import annotations

import os


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the platform has one, else every core)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1
