"""Text resources read by several model-side packages: class names, prompt templates, WordNet and the LLM client.

They sit below `detectors`, `zeroshot` and `extract` because extraction (label embeddings), zero-shot scoring
(vocabularies), accuracy (class names), the audit (WordNet scan) and the annotation app (LLM evidence) all read them.
"""
