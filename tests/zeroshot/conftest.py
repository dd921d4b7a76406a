"""Fixtures of the zero-shot tests: a deterministic text embedder and a toy lexicon."""

from __future__ import annotations

import pytest

from oodbench.zeroshot.vocab.lexicon import Lexicon, Synset

from .zeroshot_helpers import HashEmbedder


@pytest.fixture
def hash_embedder() -> HashEmbedder:
    return HashEmbedder()


@pytest.fixture
def toy_lexicon() -> Lexicon:
    """Ten noun and three adjective synsets; 'kitty' is a WordNet synonym of the ID class 'cat' (n00000001)."""
    return Lexicon(
        [
            Synset("n", 1, "noun.animal", ("cat", "kitty")),
            Synset("n", 2, "noun.animal", ("dog", "domestic dog")),
            Synset("n", 3, "noun.artifact", ("kitty", "pot")),  # 'kitty' also heads another synset (a pool of money)
            Synset("n", 4, "noun.artifact", ("hammer",)),
            Synset("n", 5, "noun.artifact", ("violin", "fiddle")),
            Synset("n", 6, "noun.location", ("desert",)),
            Synset("n", 7, "noun.object", ("glacier",)),
            Synset("n", 8, "noun.plant", ("oak", "oak tree")),
            Synset("n", 9, "noun.food", ("bread",)),
            Synset("n", 10, "noun.person", ("sailor", "crewman")),
            Synset("a", 11, "adj.all", ("furry",)),
            Synset("a", 12, "adj.all", ("metallic",)),
            Synset("a", 13, "adj.all", ("icy",)),
        ]
    )
