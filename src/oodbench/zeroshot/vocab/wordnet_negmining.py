"""WordNet negative labels by NegMining (NegLabel, ICLR 2024): keep the candidates farthest from every ID name.

Candidates are the first lemma of every WordNet noun and adjective synset: by default all of them (pool ``all``, the
Fi-ImageNet-1k paper's 79,403 head lemmas), or without the noun.animal and noun.food files (pool ``neglabel``, as
NegLabel's corpus). Candidates equal to an ID name or to a WordNet synonym of one are dropped
first (NegLabel's own list keeps 32 exact ImageNet names; we do not). Nouns and ID names are embedded with the
prompt ``the nice {}``, adjectives with ``This is a {} photo``. A candidate's closeness to the ID set is the 95th
percentile of its cosine similarities to the ID names; nouns and adjectives are ranked separately, farthest (least
close) first, and the top M are kept with the two parts in proportion to their sizes. The full rankings are stored
so any prefix size M can be selected later (the Fi-ImageNet-1k paper's Fig. A2).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ...core.errors import ZeroShotError
from ...text.classes import ClassList
from ...text.templates import NEGMINING_ADJECTIVE_TEMPLATE, NEGMINING_NOUN_TEMPLATE
from ...util.chunking import DEFAULT_CHUNK_BYTES, iter_chunks, rows_per_chunk
from ..text import EmbedFn, embed_labels
from .artefact import ADJECTIVE, NOUN, Vocabulary
from .labels import IdFilter
from .lexicon import DEFAULT_POOL, LEXICON_RESOURCE, Lexicon, packaged_lexicon, pool_exclusions

__all__ = ["closeness_to_id", "rank_farthest", "mine_wordnet_negatives", "DEFAULT_M"]

DEFAULT_M = 5000


def closeness_to_id(
    candidates: np.ndarray,
    id_embeddings: np.ndarray,
    *,
    percentile: float = 95.0,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> np.ndarray:
    """Per candidate, the `percentile`-th percentile (linear interpolation) of its cosine to the ID embeddings."""
    if not 0.0 <= percentile <= 100.0:
        raise ZeroShotError(f"percentile must lie in [0, 100]; got {percentile}")
    if candidates.shape[0] == 0:
        return np.zeros(0)
    if candidates.shape[1] != id_embeddings.shape[1]:
        raise ZeroShotError(
            f"candidate embeddings have D={candidates.shape[1]}, ID embeddings D={id_embeddings.shape[1]}"
        )
    out = np.empty(candidates.shape[0])
    step = rows_per_chunk(2 * id_embeddings.shape[0], budget_bytes=chunk_bytes)
    for rows in iter_chunks(candidates.shape[0], step):
        cosine = (candidates[rows] @ id_embeddings.T).astype(np.float64)
        out[rows] = np.percentile(cosine, percentile, axis=1, method="linear")
    return out


def rank_farthest(words: Sequence[str], closeness: np.ndarray) -> list[str]:
    """Words ordered from least to most close to the ID set (ties keep the input order)."""
    order = np.argsort(np.asarray(closeness), kind="stable")
    return [words[i] for i in order]


def mine_wordnet_negatives(
    id_classes: ClassList,
    embed: EmbedFn,
    *,
    m: int = DEFAULT_M,
    percentile: float = 95.0,
    lexicon: Lexicon | None = None,
    pool: str = DEFAULT_POOL,
    name: str = "wordnet",
    model: str | None = None,
) -> Vocabulary:
    """A 'wordnet' vocabulary: the M WordNet nouns/adjectives farthest from the ID names, with full rankings."""
    exclude_lexnames = pool_exclusions(pool)
    packaged = lexicon is None
    lexicon = packaged_lexicon() if lexicon is None else lexicon
    # A word that heads both a noun and an adjective synset is a noun candidate only (one embedding per word).
    nouns, adjectives = lexicon.candidates(exclude_lexnames)
    pool_size = len(nouns) + len(adjectives)
    id_filter = IdFilter(id_classes.names, id_classes.wnids, lexicon)
    nouns, dropped_nouns = id_filter.keep(nouns)
    adjectives, dropped_adjectives = id_filter.keep(adjectives)
    if m > len(nouns) + len(adjectives):
        raise ZeroShotError(f"M={m} exceeds the {len(nouns) + len(adjectives)} candidates left after ID filtering")

    id_embeddings = embed_labels(embed, list(id_classes.names), (NEGMINING_NOUN_TEMPLATE,))
    ranked = {}
    for pos, words, template in (
        (NOUN, nouns, NEGMINING_NOUN_TEMPLATE),
        (ADJECTIVE, adjectives, NEGMINING_ADJECTIVE_TEMPLATE),
    ):
        embeddings = embed_labels(embed, words, (template,))
        ranked[pos] = (
            rank_farthest(words, closeness_to_id(embeddings, id_embeddings, percentile=percentile)) if words else []
        )
    vocab = Vocabulary(
        name=name,
        kind="wordnet",
        labels=[],
        ranked=ranked,
        params={
            "m": int(m),
            "percentile": float(percentile),
            "pool": pool,
            "exclude_lexnames": list(exclude_lexnames),
            "noun_template": NEGMINING_NOUN_TEMPLATE,
            "adjective_template": NEGMINING_ADJECTIVE_TEMPLATE,
            "id_classes": id_classes.hash,
        },
        provenance={
            "source": "WordNet 3.0 (Princeton) first lemmas, NegMining (Jiang et al., ICLR 2024)",
            "lexicon": "/".join(LEXICON_RESOURCE) if packaged else f"custom ({len(lexicon)} synsets)",
            "model": model,
            "id_classes": id_classes.describe(),
            "pool": {"name": pool, "excluded_lexnames": list(exclude_lexnames), "head_lemmas": pool_size},
            "candidates": {"nouns": len(nouns), "adjectives": len(adjectives)},
            "dropped_id_names_or_synonyms": sorted(set(dropped_nouns) | set(dropped_adjectives)),
        },
    )
    vocab.labels = vocab.select(m=m)
    return vocab
