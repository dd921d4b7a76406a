"""Plain dicts of the analysis result records, ready for strict JSON."""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any

__all__ = ["plain_dict"]


def plain_dict(record: Any) -> dict[str, object]:
    """The fields of a flat dataclass record; NaN and ±inf become None, since strict JSON has neither."""
    values = {f.name: getattr(record, f.name) for f in fields(record)}
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in values.items()}
