"""The audit's thresholds and choices in one place; every number the verdicts depend on is configurable here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ..core.errors import AuditError

__all__ = ["AuditConfig", "DEFAULT_POOL", "ISOLATION_FOREST", "DEFAULT_LOGIT_DETECTORS"]

# The unsupervised pool: detectors that read the ID fit set (features, labels) but not the head or logits.
ISOLATION_FOREST = "iforest"
DEFAULT_POOL = ("maha", "rmaha", "maha++", "rmaha++", "knn", ISOLATION_FOREST)
# Head-dependent scores, reported beside the pool and flagged: they are never part of the firing rule.
DEFAULT_LOGIT_DETECTORS = ("msp", "maxlogit", "energy")


@dataclass(frozen=True)
class AuditConfig:
    """Thresholds of the firing rule, the contrast and the adjudication, plus the detector pool.

    ``identity_permutations`` / ``identity_null_z``: on the automatic contrast (suspects found, not given) a
    recovery counts as a leak only if the OOD images are indistinguishable from the excluded class's own fit rows:
    their OracleLDA must not exceed the mean + ``identity_null_z`` standard deviations of its permutation null
    (3.09: one-sided 0.1 % under a normal approximation). No number here was tuned on a battery.

    ``pool=None`` means the default pool restricted to detectors registered now (the Isolation Forest is always
    there); ``pool_params`` maps a pool member to its hyper-parameters, e.g. ``{"knn": {"k": 10}}``.
    """

    oracle_threshold: float = 0.95
    collapse_threshold: float = 0.65
    recovery_margin: float = 0.10
    folds: int = 5
    pool: tuple[str, ...] | None = None
    pool_params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    logit_detectors: tuple[str, ...] = DEFAULT_LOGIT_DETECTORS
    max_rows_per_side: int = 20_000
    suspect_mass: float = 0.5
    max_suspects: int = 3
    nearest_per_ood: int = 10
    identity_threshold: float | None = None
    identity_permutations: int = 19
    identity_null_z: float = 3.09
    probe_max_per_class: int = 500
    probe_c: float = 1.0
    overlap_k: int = 10
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("oracle_threshold", "collapse_threshold"):
            value = getattr(self, name)
            if not 0.5 <= value <= 1.0:
                raise AuditError(f"{name} must be an AUROC in [0.5, 1]; got {value}")
        if not 0.0 <= self.recovery_margin <= 0.5:
            raise AuditError(f"recovery_margin must lie in [0, 0.5]; got {self.recovery_margin}")
        if self.collapse_threshold + self.recovery_margin > 1.0:
            raise AuditError("collapse_threshold + recovery_margin exceeds 1: no AUROC could count as a recovery")
        if self.identity_threshold is not None and not 0.5 <= self.identity_threshold <= 1.0:
            raise AuditError(f"identity_threshold must be None or an AUROC in [0.5, 1]; got {self.identity_threshold}")
        if not isinstance(self.folds, int) or self.folds < 2:
            raise AuditError(
                f"folds must be an integer >= 2 (out-of-fold reading needs held-out folds); got {self.folds}"
            )
        if not self.identity_null_z > 0:
            raise AuditError(f"identity_null_z must be positive; got {self.identity_null_z}")
        for name in (
            "max_rows_per_side",
            "max_suspects",
            "nearest_per_ood",
            "probe_max_per_class",
            "overlap_k",
            "identity_permutations",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise AuditError(f"{name} must be a positive integer; got {value!r}")
        if not 0.0 < self.suspect_mass <= 1.0:
            raise AuditError(f"suspect_mass must lie in (0, 1]; got {self.suspect_mass}")
        if self.probe_c <= 0:
            raise AuditError(f"probe_c must be positive; got {self.probe_c}")
        if self.pool is not None:
            object.__setattr__(self, "pool", tuple(self.pool))
            if not self.pool:
                raise AuditError("pool is empty: give at least one fit-set-based detector (or None for the default)")
        object.__setattr__(self, "logit_detectors", tuple(self.logit_detectors))
        unknown = sorted(set(self.pool_params) - set(self.pool or DEFAULT_POOL))
        if unknown:
            raise AuditError(f"pool_params names detectors outside the pool: {', '.join(unknown)}")
        self._check_detectors()

    def _check_detectors(self) -> None:
        """Refuse, before any work, a pool parameter a detector does not take and an unknown logit detector: either
        would otherwise drop that detector from the audit (and a pool member from the firing rule)."""
        from .. import detectors
        from ..core.errors import DetectorError

        registered = set(detectors.available())
        for name, params in self.pool_params.items():
            if name in registered:
                try:
                    detectors.create(name, **dict(params))
                except DetectorError as exc:
                    raise AuditError(f"pool_params for {name}: {exc}") from None
        unknown = sorted(set(self.logit_detectors) - registered)
        if unknown:
            raise AuditError(f"logit detectors not registered: {', '.join(unknown)}")

    @property
    def recovery_threshold(self) -> float:
        """AUROC the refit pool must reach for the contrast to count as a recovery."""
        return self.collapse_threshold + self.recovery_margin

    def with_(self, **changes: Any) -> AuditConfig:
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain-data view for JSON reports."""
        data = asdict(self)
        data["pool_params"] = {k: dict(v) for k, v in self.pool_params.items()}
        return data
