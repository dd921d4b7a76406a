"""Helpers shared by the zero-shot tests.

No zero-shot test needs ../shared: the NegLabel lists ship with the package or as a test fixture (tests/zeroshot/data,
with their licence), and class lists come from timm's metadata.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")


class HashEmbedder:
    """Deterministic fake text encoder: each prompt maps to a seeded random unit vector; templates are averaged.

    `fixed` pins the embedding of chosen *labels* (before templates) so a test can place words where it wants.
    Calls are recorded so tests can check caching.
    """

    def __init__(self, dim: int = 16, fixed: dict[str, np.ndarray] | None = None) -> None:
        self.dim = dim
        self.fixed = {k: np.asarray(v, dtype=np.float64) for k, v in (fixed or {}).items()}
        self.calls: list[tuple[tuple[str, ...], tuple[str, ...]]] = []

    def vector(self, text: str) -> np.ndarray:
        seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
        v = np.random.default_rng(seed).normal(size=self.dim)
        return v / np.linalg.norm(v)

    def __call__(self, labels: Sequence[str], templates: Sequence[str]) -> np.ndarray:
        self.calls.append((tuple(labels), tuple(templates)))
        rows = []
        for label in labels:
            if label in self.fixed:
                rows.append(self.fixed[label] / np.linalg.norm(self.fixed[label]))
                continue
            mean = np.mean([self.vector(t.format(label)) for t in templates], axis=0)
            rows.append(mean / np.linalg.norm(mean))
        return np.asarray(rows, dtype=np.float32)


def toy_vocabularies() -> list:
    """Four small vocabularies, one of each kind a zero-shot run sweeps (WordNet, LLM siblings, oracle, EOE)."""
    from oodbench.zeroshot.vocab.artefact import ADJECTIVE, NOUN, Vocabulary

    wordnet = Vocabulary(
        "wn",
        "wordnet",
        [],
        params={"m": 4},
        ranked={NOUN: ["rock", "bus", "violin", "lamp"], ADJECTIVE: ["shiny", "icy"]},
    )
    wordnet.labels = wordnet.select()
    siblings = Vocabulary(
        "llm",
        "siblings",
        [],
        params={"k": 1},
        per_class={"apple": ["pear", "plum"], "bus": ["tram", "coach"], "cloud": ["fog", "smoke"]},
    )
    siblings.labels = siblings.select()
    oracle = Vocabulary("oracle", "oracle", ["rock", "violin", "lamp"])
    eoe = Vocabulary("eoe-far", "eoe", ["rock", "lamp", "galaxy"])
    return [wordnet, siblings, oracle, eoe]
