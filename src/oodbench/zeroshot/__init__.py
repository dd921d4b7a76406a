"""Zero-shot OOD detection with vision-language models: scores from cached embeddings and label vocabularies.

Scores (`oodbench.zeroshot.scores`) take arrays: ℓ2-normalised image embeddings (N, D), label embeddings (L, D),
optionally patch embeddings (N, P, D). Vocabularies (`oodbench.zeroshot.vocab`) are versioned artefacts built from
WordNet (NegMining), an LLM (siblings, EOE outliers), their union, or the benchmark's own OOD labels (oracle).
`oodbench.zeroshot.evaluate` runs model × score × vocabulary × OOD set from a feature store.
"""

from .scores import (
    LOGIT_SCORES,
    TAU,
    available_scores,
    compute_score,
    eoe_scores,
    glmcm_scores,
    logit_scores,
    neglabel_scores,
)

__all__ = [
    "TAU",
    "LOGIT_SCORES",
    "available_scores",
    "compute_score",
    "logit_scores",
    "glmcm_scores",
    "neglabel_scores",
    "eoe_scores",
]
