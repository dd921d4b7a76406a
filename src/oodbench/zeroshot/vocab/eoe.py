"""EOE outlier lists (Cao et al., ICML 2024): outlier class names an LLM envisions from the ID label set.

Three prompt families, written here in our own words after the paper's description:

- ``far``: the LLM groups the ID classes into broad categories and names L classes visually unlike all of them;
- ``near``: for each ID class, a few classes that look similar but come from different, broader domains;
- ``fine_grained``: L further sub-categories of the ID set's super-category (e.g. other bird species).

Names are parsed robustly, normalised, de-duplicated, and those equal to an ID name or a WordNet synonym of one
are dropped. For ``far``/``fine_grained`` the LLM is asked again (new generation index, cached) until L distinct
names are collected or `max_requests` is reached; ``near`` asks once per class (plus re-asks for unusable replies).
"""

from __future__ import annotations

from collections.abc import Callable

from ...core.errors import ZeroShotError
from ...text.classes import ClassList
from ...text.llm import ChatClient, Messages
from .artefact import Vocabulary
from .labels import IdFilter
from .lexicon import Lexicon, packaged_lexicon
from .parsing import parse_name_list
from .siblings import collect_replies, unanswered_error

__all__ = ["EOE_TASKS", "eoe_messages", "generate_eoe_outliers", "DEFAULT_SIZE", "PROMPT_VERSION"]

EOE_TASKS = ("far", "near", "fine_grained")
DEFAULT_SIZE = 500
PROMPT_VERSION = "eoe-v1"
SYSTEM = "You help design outlier-exposure label sets for zero-shot out-of-distribution detection."
PROMPTS = {
    "far": (
        "An image classifier recognises these {c} categories: {classes}. First decide which broad groups these "
        "categories fall into. Then name {n} categories of objects, animals, plants or scenes that look clearly "
        "different from every one of those groups and are unrelated to them. Answer only with a JSON array of "
        "{n} short English names."
    ),
    "near": (
        'Name {n} categories that look visually similar to "{name}" in a photograph but come from broader, '
        'different domains than "{name}" (not the same kind of thing, not a sub-type or synonym of it). '
        "Answer only with a JSON array of {n} short English names."
    ),
    "fine_grained": (
        "An image classifier recognises these {c} kinds of {super_class}: {classes}. Name {n} other kinds "
        "of {super_class} that look similar to these but are not among them. Answer only with a JSON "
        "array of {n} short English names."
    ),
}


def eoe_messages(
    task: str, id_names: list[str], *, n: int, name: str | None = None, super_class: str | None = None
) -> Messages:
    """Chat messages for one EOE request (`name` for 'near', `super_class` for 'fine_grained')."""
    if task not in PROMPTS:
        raise ZeroShotError(f"unknown EOE task {task!r}; tasks: {', '.join(EOE_TASKS)}")
    text = PROMPTS[task].format(c=len(id_names), classes="; ".join(id_names), n=n, name=name, super_class=super_class)
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]


def generate_eoe_outliers(
    id_classes: ClassList,
    client: ChatClient,
    *,
    task: str = "far",
    size: int = DEFAULT_SIZE,
    per_class: int = 3,
    super_class: str | None = None,
    max_requests: int = 10,
    min_items: int = 3,
    workers: int = 4,
    lexicon: Lexicon | None = None,
    name: str | None = None,
    allow_incomplete: bool = False,
    on_progress: Callable[[int], None] | None = None,
) -> Vocabulary:
    """An 'eoe' vocabulary of up to `size` (L) envisioned outlier names for the ID classes.

    For the per-class 'near' task, classes left without a usable answer are refused unless `allow_incomplete`.
    """
    if task not in EOE_TASKS:
        raise ZeroShotError(f"unknown EOE task {task!r}; tasks: {', '.join(EOE_TASKS)}")
    if task == "fine_grained" and not super_class:
        raise ZeroShotError("the fine_grained EOE task needs the ID set's super-category (e.g. --super-class 'bird')")
    if size < 1 or per_class < 1 or max_requests < 1:
        raise ZeroShotError("size, per_class and max_requests must be >= 1")
    lexicon = packaged_lexicon() if lexicon is None else lexicon
    id_filter = IdFilter(id_classes.names, id_classes.wnids, lexicon)
    names = list(id_classes.names)
    collected: dict[str, None] = {}
    dropped: set[str] = set()
    failures = 0
    if task == "near":
        prompts = [eoe_messages("near", names, n=per_class, name=n) for n in names]
        parsed, failed = collect_replies(
            client,
            prompts,
            generations=1,
            min_items=min(min_items, per_class),
            max_attempts=max_requests,
            workers=workers,
            max_items=per_class,
            on_progress=on_progress,
        )
        failures = len(failed)
        if failed and not allow_incomplete:
            raise unanswered_error([names[p] for p, _ in failed], len(names), max_requests, "near outliers")
        for per_prompt in parsed:
            kept, gone = id_filter.keep(per_prompt[0])
            collected.update(dict.fromkeys(kept))
            dropped.update(gone)
    else:
        messages = eoe_messages(task, names, n=size, super_class=super_class)
        # Sequential on purpose: each further request is only sent while names are still missing.
        for generation in range(max_requests):
            if len(collected) >= size:
                break
            found = parse_name_list(
                client.complete(messages, generation=generation, accept=lambda r: len(parse_name_list(r)) >= min_items),
                max_names=size,
            )
            if len(found) < min_items:
                failures += 1
            kept, gone = id_filter.keep(found)
            collected.update(dict.fromkeys(kept))
            dropped.update(gone)
            if on_progress is not None:
                on_progress(generation)
    labels = list(collected)[:size]
    if not labels:
        raise ZeroShotError(
            f"the LLM gave no usable outlier names for EOE task {task!r} "
            f"({failures} unusable replies); check the model and the cached replies in {client.cache_dir}"
        )
    return Vocabulary(
        name=name or f"eoe-{task}",
        kind="eoe",
        labels=labels,
        params={
            "task": task,
            "size": int(size),
            "per_class": int(per_class) if task == "near" else None,
            "super_class": super_class,
            "prompt_version": PROMPT_VERSION,
            "id_classes": id_classes.hash,
        },
        provenance={
            "source": "EOE envisioned outliers (Cao et al., ICML 2024), prompts in oodbench's own words",
            "llm": client.config.public(),
            "prompt": PROMPTS[task],
            "system": SYSTEM,
            "id_classes": id_classes.describe(),
            "dropped_id_names_or_synonyms": sorted(dropped),
            "unusable_replies": failures,
            "requests": dict(client.stats),
            "short_of_size": max(0, size - len(labels)),
        },
    )
