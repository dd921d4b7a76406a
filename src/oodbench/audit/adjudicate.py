"""Adjudication of one split from its fingerprint and contrast: leak, hard-clean, clean or inconclusive, with reasons."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .config import AuditConfig
from .contrast import ContrastResult
from .fingerprint import Fingerprint

__all__ = ["Verdict", "adjudicate", "LEAK", "HARD_CLEAN", "CLEAN", "INCONCLUSIVE", "VERDICTS"]

LEAK, HARD_CLEAN, CLEAN, INCONCLUSIVE = "leak", "hard-clean", "clean", "inconclusive"
VERDICTS = (LEAK, HARD_CLEAN, CLEAN, INCONCLUSIVE)


@dataclass
class Verdict:
    """The label of a split and the sentences (with the numbers) that decided it."""

    label: str
    reasons: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain-data view."""
        return {"label": self.label, "reasons": list(self.reasons)}


def adjudicate(fp: Fingerprint, contrast: ContrastResult | None, config: AuditConfig | None = None) -> Verdict:
    """Combine the firing rule and the exclusion contrast into one verdict.

    - ``clean``: the rule does not fire (and the oracle's fold range does not straddle its threshold while
      the pool has collapsed, which would make the rule hinge on fold noise: then ``inconclusive``).
    - ``leak``: the rule fires and refitting without the suspect data recovers detection
      (best AUROC >= collapse threshold + margin).
    - ``hard-clean``: the rule fires but the refit pool stays below the collapse threshold; or, on the automatic
      contrast (suspects found by proximity), detection recovers but the OOD images are distinct from the excluded
      class's own fit rows beyond the identity reading's permutation null (a close neighbour, not the OOD class).
    - ``inconclusive``: the rule fires and there is no contrast, or the recovery is only partial (between the
      collapse threshold and the recovery threshold), or (when ``identity_threshold`` is set) the OOD images are
      linearly separable from the excluded class's own fit data, i.e. a close but distinct class.
    """
    config = config or AuditConfig()
    oracle = fp.oracle
    rule = (
        f"OracleLDA {oracle.auroc:.3f} (folds {oracle.low:.3f}-{oracle.high:.3f}) vs {fp.oracle_threshold:.2f}; "
        f"best unsupervised {fp.best_detector} {fp.best_auroc:.3f} vs collapse {fp.collapse_threshold:.2f}"
    )
    if not fp.fires:
        if fp.best_auroc < fp.collapse_threshold and fp.oracle_straddles:
            return Verdict(INCONCLUSIVE, [f"rule silent only by fold noise: {rule}"])
        why = (
            "the pool detects the OOD set"
            if fp.best_auroc >= fp.collapse_threshold
            else "the embedding does not separate the pair linearly, so a low unsupervised AUROC is expected"
        )
        return Verdict(CLEAN, [f"rule does not fire ({why}): {rule}"])
    reasons = [f"rule fires: {rule}"]
    if contrast is None:
        return Verdict(INCONCLUSIVE, reasons + ["no exclusion contrast was run"])
    excluded = (
        f"excluding suspect class(es) {list(contrast.suspects)} ({contrast.removed_rows} fit rows)"
        if contrast.mode == "label"
        else f"excluding the {contrast.removed_rows} fit rows nearest the OOD images"
    )
    change = (
        f"{excluded}: best unsupervised {contrast.best_before:.3f} -> {contrast.best_after_detector} "
        f"{contrast.best_after:.3f} (recovery needs >= {contrast.recovery_threshold:.2f})"
    )
    if contrast.removed_rows == 0:
        return Verdict(HARD_CLEAN, reasons + [f"{change}; {contrast.note}"])
    if contrast.recovered and contrast.suspects_auto and contrast.identity_distinct:
        # The excluded class was chosen by proximity; the OOD images are distinct from it beyond what chance gives.
        identity = contrast.identity
        return Verdict(
            HARD_CLEAN,
            reasons
            + [
                f"{change}, but the OOD images are distinct from the nearest excluded class "
                f"{contrast.identity_class}'s own fit rows (OracleLDA {identity.auroc:.3f} > {contrast.identity_limit:.3f}, "
                f"the mean + {config.identity_null_z:g} sd of {len(contrast.identity_null)} label permutations): "
                "excluding a close neighbour lets detection recover, as on an intrinsically hard clean pair "
                "(designate the class as suspect if the OOD set is that class from another source)"
            ],
        )
    if contrast.recovered and contrast.suspects_auto and contrast.identity is None:
        return Verdict(
            INCONCLUSIVE,
            reasons + [f"{change}, but the suspects were found automatically and too few rows remain to read identity"],
        )
    if contrast.recovered:
        identity = contrast.identity
        if (
            config.identity_threshold is not None
            and identity is not None
            and identity.auroc >= config.identity_threshold
        ):
            return Verdict(
                INCONCLUSIVE,
                reasons
                + [
                    f"{change}, but the OOD images are separable from the excluded class's fit data "
                    f"(OracleLDA {identity.auroc:.3f} >= {config.identity_threshold:.2f}): a close, distinct class"
                ],
            )
        extra = f"; OOD vs excluded fit data OracleLDA {identity.auroc:.3f}" if identity is not None else ""
        return Verdict(LEAK, reasons + [f"detection recovers: {change}{extra}"])
    if contrast.partial:
        return Verdict(INCONCLUSIVE, reasons + [f"partial recovery: {change}"])
    return Verdict(HARD_CLEAN, reasons + [f"no recovery: {change}"])
