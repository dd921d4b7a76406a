"""LLM per-class siblings: for each ID class, fine-grained near neighbours an LLM names, as negative labels.

For each class and generation the LLM is asked for `per_class` (20) siblings. Replies are parsed robustly; a reply
with fewer than `min_items` names is asked again under a new attempt index (up to `max_attempts`), so a rerun
replays exactly the same cached sequence and sends no request twice. Siblings that equal an ID name or a WordNet
synonym of one (or of the class itself) are removed; the generations of a class are merged (first-seen order,
de-duplicated) and then put in a seeded random order per class, so that keeping the first k per class is a random
subset whose size can be swept later (the Fi-ImageNet-1k paper's Figs. A1/A3).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ...core.errors import ZeroShotError
from ...text.classes import ClassList, normalize_label
from ...text.llm import ChatClient, Messages
from .artefact import Vocabulary
from .labels import IdFilter
from .lexicon import Lexicon, packaged_lexicon
from .parsing import parse_name_list

__all__ = [
    "siblings_messages",
    "generate_siblings",
    "class_keys",
    "collect_replies",
    "unanswered_error",
    "PROMPT_VERSION",
]

PROMPT_VERSION = "siblings-v1"
SYSTEM = "You are an expert in visual taxonomy who helps build label vocabularies for image classifiers."
PROMPT = (
    'Name {n} fine-grained categories that are close siblings of "{name}" in a visual taxonomy: things that share '
    "its parent category and could be confused with it in a photograph, but are different things. Do not include "
    '"{name}" itself, its synonyms, or broader or narrower categories of it.{context} Answer only with a JSON array '
    "of {n} short English names."
)
# Generation index of (generation g, attempt a) in the request cache: distinct for every pair.
_ATTEMPT_STRIDE = 1000


def siblings_messages(name: str, n: int, context: str | None = None) -> Messages:
    """Chat messages asking for `n` fine-grained siblings of class `name`."""
    extra = f" The classifier's classes come from {context}." if context else ""
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": PROMPT.format(n=n, name=name, context=extra)},
    ]


def class_keys(id_classes: ClassList) -> list[str]:
    """Unique per-class keys: the class name, suffixed with its WordNet id or index where names repeat."""
    counts: dict[str, int] = {}
    for name in id_classes.names:
        counts[name] = counts.get(name, 0) + 1
    keys = []
    for i, name in enumerate(id_classes.names):
        if counts[name] == 1:
            keys.append(name)
        else:
            wnid = id_classes.wnids[i] if id_classes.wnids else None
            keys.append(f"{name} ({wnid or i})")
    return keys


def collect_replies(
    client: ChatClient,
    prompts: Sequence[Messages],
    *,
    generations: int,
    min_items: int,
    max_attempts: int,
    workers: int,
    max_items: int | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> tuple[list[list[list[str]]], list[tuple[int, int]]]:
    """Parsed names per prompt and generation, re-asking (new attempt index) replies with < `min_items` names.

    Returns (names[prompt][generation], failures) where failures lists (prompt, generation) pairs that never gave
    enough names. Only replies with enough names are cached, so a rerun replays the usable ones from the cache and
    asks the others again. At most `max_items` names are kept from one reply (what was asked for).
    """
    if generations < 1 or max_attempts < 1 or min_items < 0:
        raise ZeroShotError("generations and max_attempts must be >= 1 and min_items >= 0")

    def names_of(reply: str) -> list[str]:
        return parse_name_list(reply, max_names=max_items)

    def usable(reply: str) -> bool:
        return len(names_of(reply)) >= min_items

    parsed: list[list[list[str]]] = [[[] for _ in range(generations)] for _ in prompts]
    pending = [(p, g) for p in range(len(prompts)) for g in range(generations)]
    for attempt in range(max_attempts):
        if not pending:
            break
        requests = [(prompts[p], g + attempt * _ATTEMPT_STRIDE) for p, g in pending]
        replies = client.complete_many(requests, workers=workers, on_done=on_progress, accept=usable)
        still = []
        for (p, g), reply in zip(pending, replies, strict=True):
            names = names_of(reply)
            if len(names) >= min_items:
                parsed[p][g] = names
            else:
                parsed[p][g] = names if len(names) > len(parsed[p][g]) else parsed[p][g]
                still.append((p, g))
        pending = still
    return parsed, pending


def unanswered_error(keys: Sequence[str], total: int, max_attempts: int, what: str) -> ZeroShotError:
    """The refusal to save a vocabulary with classes the LLM left without a usable answer."""
    return ZeroShotError(
        f"{len(keys)} of {total} classes got no usable list of {what} in {max_attempts} attempt(s) "
        f"(e.g. {', '.join(repr(k) for k in keys[:3])}); unusable replies are not cached, so a rerun asks them "
        "again (--max-attempts sets how often one run re-asks); --allow-incomplete saves the vocabulary without them"
    )


def generate_siblings(
    id_classes: ClassList,
    client: ChatClient,
    *,
    per_class: int = 20,
    generations: int = 1,
    k: int = 20,
    seed: int = 0,
    min_items: int | None = None,
    max_attempts: int = 3,
    workers: int = 4,
    context: str | None = None,
    lexicon: Lexicon | None = None,
    name: str = "siblings",
    allow_incomplete: bool = False,
    on_progress: Callable[[int], None] | None = None,
) -> Vocabulary:
    """A 'siblings' vocabulary: LLM-named near siblings of every ID class, k per class in a seeded random order.

    Classes left without `min_items` usable names after `max_attempts` are refused (ZeroShotError) unless
    `allow_incomplete`, when they are recorded in the provenance and keep what they got.
    """
    if per_class < 1 or k < 0:
        raise ZeroShotError(f"per_class must be >= 1 and k >= 0; got per_class={per_class}, k={k}")
    min_items = max(1, per_class // 4) if min_items is None else min_items
    lexicon = packaged_lexicon() if lexicon is None else lexicon
    prompts = [siblings_messages(n, per_class, context) for n in id_classes.names]
    parsed, failures = collect_replies(
        client,
        prompts,
        generations=generations,
        min_items=min_items,
        max_attempts=max_attempts,
        workers=workers,
        max_items=per_class,
        on_progress=on_progress,
    )
    keys = class_keys(id_classes)
    unanswered = [keys[p] for p, _ in sorted(set(failures))]
    if unanswered and not allow_incomplete:
        raise unanswered_error(list(dict.fromkeys(unanswered)), len(keys), max_attempts, "siblings")
    id_filter = IdFilter(id_classes.names, id_classes.wnids, lexicon)
    per_class_lists: dict[str, list[str]] = {}
    dropped_total = 0
    for index, (key, class_name) in enumerate(zip(keys, id_classes.names, strict=True)):
        own = {normalize_label(class_name)} | lexicon.synonyms(class_name)
        merged = [n for generation in parsed[index] for n in generation]
        candidates, dropped = id_filter.keep(merged)
        kept = [n for n in candidates if n not in own]
        dropped_total += len(dropped) + len(candidates) - len(kept)
        # Seeded per class (seed, class index): the order does not depend on other classes or on the platform.
        order = np.random.default_rng([seed, index]).permutation(len(kept))
        per_class_lists[key] = [kept[i] for i in order]
    vocab = Vocabulary(
        name=name,
        kind="siblings",
        labels=[],
        per_class=per_class_lists,
        params={
            "k": int(k),
            "per_class": int(per_class),
            "generations": int(generations),
            "seed": int(seed),
            "prompt_version": PROMPT_VERSION,
            "context": context,
            "id_classes": id_classes.hash,
        },
        provenance={
            "source": "LLM per-class siblings",
            "llm": client.config.public(),
            "prompt": PROMPT,
            "system": SYSTEM,
            "id_classes": id_classes.describe(),
            "dropped_id_names_or_synonyms": dropped_total,
            "classes_without_enough_names": unanswered,
            "requests": dict(client.stats),
        },
    )
    vocab.labels = vocab.select(k=k)
    return vocab
