"""Negative-label and outlier vocabularies: WordNet NegMining, LLM siblings, union, oracle, EOE; versioned artefacts."""
