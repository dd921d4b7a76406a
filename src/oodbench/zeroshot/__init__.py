"""Zero-shot OOD detection with vision-language models: scores from cached embeddings and label vocabularies.

Scores (`oodbench.zeroshot.scores`) take arrays: ℓ2-normalised image embeddings (N, D), label embeddings (L, D),
optionally patch embeddings (N, P, D). Vocabularies (`oodbench.zeroshot.vocab`) are versioned artefacts built from
WordNet (NegMining), an LLM (siblings, EOE outliers), their union, or the benchmark's own OOD labels (oracle).
`oodbench.zeroshot.evaluate` runs model × score × vocabulary × OOD set from a feature store.

Every name below is imported from its module on first use (`oodbench.util.lazy`), so that importing the package
(and `oodbench --help`) stays fast.
"""

from __future__ import annotations

from ..util.lazy import lazy_package

_EXPORTS = {
    "TAU": ".scores",
    "LOGIT_SCORES": ".scores",
    "available_scores": ".scores",
    "compute_score": ".scores",
    "logit_scores": ".scores",
    "glmcm_scores": ".scores",
    "neglabel_scores": ".scores",
    "eoe_scores": ".scores",
}

__all__ = list(_EXPORTS)
lazy_package(__name__, _EXPORTS)
