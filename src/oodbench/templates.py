"""Prompt templates for embedding label names with a vision-language model."""

from __future__ import annotations

# The Fi-ImageNet-1k paper's Appendix G: the bare class name plus the seven ImageNet prompt templates that OpenAI's CLIP
# prompt-engineering notebook selected as its best small ensemble.
SEED_TEMPLATES: tuple[str, ...] = (
    "{}",
    "itap of a {}.",
    "a bad photo of the {}.",
    "a origami {}.",
    "a photo of the large {}.",
    "a {} in a video game.",
    "art of the {}.",
    "a photo of the small {}.",
)

# NegLabel's mining prompts (used only to rank candidate negatives, never for scoring).
NEGMINING_NOUN_TEMPLATE = "the nice {}"
NEGMINING_ADJECTIVE_TEMPLATE = "This is a {} photo"


def fill(templates: tuple[str, ...] | list[str], label: str) -> list[str]:
    """Every template filled with one label."""
    return [template.format(label) for template in templates]
