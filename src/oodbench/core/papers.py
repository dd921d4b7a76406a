"""The reference record of a method (detector or zero-shot score): citation, venue, URL."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Paper", "POST_HOC_POOL"]


@dataclass(frozen=True)
class Paper:
    """Reference for a method: short citation, venue/year and a URL."""

    citation: str
    venue: str
    url: str
    notes: str = ""


# Sec. 4.1 ("OOD Detectors") and Table 1's caption: a best-of cell is the best of the 21 post-hoc detectors for a
# supervised model and of the 7 logit-based scores for a VLM (Sec. 4.1), in oodbench's names. Other detectors a run
# holds (pytorch-ood's and OpenOOD's further post-hoc detectors, vocabulary scores) are outside the paper's pools.
POST_HOC_POOL = frozenset(
    ("msp", "maxlogit", "kl_matching", "energy", "gen", "react", "ash_s", "scale", "dice", "maha", "rmaha", "maha++")
    + ("rmaha++", "knn", "cosine", "mcm", "fdbd", "neco", "nac", "vim", "nnguide")
)
