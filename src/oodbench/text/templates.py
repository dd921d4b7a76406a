"""Prompt templates for embedding label names with a vision-language model."""

from __future__ import annotations

# The Fi-ImageNet-1k paper's Appendix G ("Zero-shot classification prompt templates"), in the order printed there: the
# bare class name, then seven of OpenAI's CLIP ImageNet templates. Every label, ID or negative, is embedded with all
# eight (Appendix F, "Zero-shot scoring"); the test pinning them cites the appendix.
SEED_TEMPLATES: tuple[str, ...] = (
    "{}",
    "a photo of a {}.",
    "a bad photo of a {}.",
    "a photo of many {}.",
    "a photo of the large {}.",
    "a photo of the small {}.",
    "a cropped photo of a {}.",
    "a close-up photo of a {}.",
)

# NegLabel's mining prompts (used only to rank candidate negatives, never for scoring).
NEGMINING_NOUN_TEMPLATE = "the nice {}"
NEGMINING_ADJECTIVE_TEMPLATE = "This is a {} photo"


def fill(templates: tuple[str, ...] | list[str], label: str) -> list[str]:
    """Every template filled with one label."""
    return [template.format(label) for template in templates]
