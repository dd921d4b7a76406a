"""Vocabularies assembled from others or from files: WN+LLM union, the oracle, and imported lists (JSON/TXT)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from ...core.errors import ZeroShotError
from ...text.classes import ClassList, normalize_label
from ...text.templates import NEGMINING_ADJECTIVE_TEMPLATE, NEGMINING_NOUN_TEMPLATE
from ...util.atomic import read_text_file
from .artefact import ADJECTIVE, KINDS, NOUN, Vocabulary
from .labels import IdFilter, dedupe
from .lexicon import Lexicon, packaged_lexicon
from .siblings import class_keys

__all__ = [
    "build_union",
    "build_oracle",
    "oracle_labels_from_store",
    "import_vocabulary",
    "read_label_file",
    "neglabel_reference_list",
    "NEGLABEL_REFERENCE",
]

# NegLabel's 10k reference negatives for ImageNet-1k (Apache-2.0 + WordNet licence; see the NOTICE beside it).
NEGLABEL_REFERENCE = ("data", "neglabel", "selected_neg_labels_in1k_10k.txt.gz")


def neglabel_reference_list() -> Path:
    """Path of NegLabel's reference list as shipped (gzip-compressed text, readable by `import_vocabulary`)."""
    resource = resources.files("oodbench").joinpath(*NEGLABEL_REFERENCE)
    if not resource.is_file():
        raise ZeroShotError(f"the packaged NegLabel list {'/'.join(NEGLABEL_REFERENCE)} is missing; reinstall oodbench")
    return Path(str(resource))


def read_list_file(path: str | os.PathLike[str], what: str) -> tuple[Any, bool]:
    """(parsed value, True) for a `.json` file; (stripped lines without blanks and '#' comments, False) otherwise."""
    path = Path(path)
    if not path.is_file():
        raise ZeroShotError(f"{what} {path} does not exist")
    compressed = path.suffix.lower() == ".gz"
    try:
        text = read_text_file(path)
    except ValueError as exc:
        raise ZeroShotError(f"{what} {path}: {exc}") from None
    if (path.with_suffix("") if compressed else path).suffix.lower() != ".json":
        return [line for line in (raw.strip() for raw in text.splitlines()) if line and not line.startswith("#")], False
    try:
        return json.loads(text), True
    except json.JSONDecodeError as exc:
        raise ZeroShotError(f"{path} is not valid JSON: {exc}") from None


def build_union(wordnet: Vocabulary, siblings: Vocabulary, *, name: str = "union") -> Vocabulary:
    """WN+LLM: the WordNet negatives (prefix M) together with the LLM siblings (k per class), de-duplicated."""
    if wordnet.ranked is None:
        raise ZeroShotError(f"{wordnet.name!r} has no WordNet ranking (kind {wordnet.kind}); build it with NegMining")
    if siblings.per_class is None:
        raise ZeroShotError(f"{siblings.name!r} has no per-class sibling lists (kind {siblings.kind})")
    ids = {wordnet.params.get("id_classes"), siblings.params.get("id_classes")} - {None}
    if len(ids) > 1:
        raise ZeroShotError(f"{wordnet.name!r} and {siblings.name!r} were built for different ID class lists")
    vocab = Vocabulary(
        name=name,
        kind="union",
        labels=[],
        ranked=wordnet.ranked,
        per_class=siblings.per_class,
        params={"m": wordnet.params.get("m"), "k": siblings.params.get("k"), "id_classes": next(iter(ids), None)},
        provenance={
            "source": "union of WordNet NegMining negatives and LLM siblings",
            "model": wordnet.provenance.get("model"),
            "parents": {
                "wordnet": {"ref": wordnet.ref, "hash": wordnet.hash},
                "siblings": {"ref": siblings.ref, "hash": siblings.hash},
            },
        },
    )
    vocab.labels = vocab.select()
    return vocab


def read_label_file(path: str | os.PathLike[str]) -> list[str] | dict[str, list[str]]:
    """Labels from a TXT file (one per line, '#' comments) or JSON (a list, or an object of lists)."""
    data, from_json = read_list_file(path, "label file")
    if from_json:
        if isinstance(data, list) and all(isinstance(x, str) for x in data):
            return data
        if isinstance(data, dict) and all(
            isinstance(v, list) and all(isinstance(x, str) for x in v) for v in data.values()
        ):
            return {str(k): list(v) for k, v in data.items()}
        raise ZeroShotError(f"{path}: expected a JSON list of strings or an object whose values are lists of strings")
    return data


def _strip_prompt(label: str) -> tuple[str, str | None]:
    """(label without a NegMining prompt, part of speech the prompt implies or None)."""
    for template, pos in ((NEGMINING_NOUN_TEMPLATE, NOUN), (NEGMINING_ADJECTIVE_TEMPLATE, ADJECTIVE)):
        prefix, _, suffix = template.lower().partition("{}")
        lowered = label.lower()
        if lowered.startswith(prefix) and lowered.endswith(suffix) and len(label) > len(prefix) + len(suffix):
            return label[len(prefix) : len(label) - len(suffix)], pos
    return label, None


def import_vocabulary(
    path: str | os.PathLike[str],
    *,
    name: str,
    kind: str,
    id_classes: ClassList | None = None,
    k: int | None = None,
    lexicon: Lexicon | None = None,
    strip_prompts: bool = True,
) -> Vocabulary:
    """A vocabulary from a list made elsewhere; ID names and their WordNet synonyms are removed when classes are given.

    A JSON object keyed by ID class names becomes per-class lists (siblings; k selectable); any other object is
    flattened (e.g. EOE's ``{"task": [...]}``). With `strip_prompts`, NegMining prompts ('the nice X', 'This is a X
    photo') are removed from labels; a 'wordnet' list that carries them (NegLabel's selected negatives, in rank order)
    keeps its noun/adjective ranking so its prefix size M can be varied.
    """
    if kind not in KINDS:
        raise ZeroShotError(f"unknown vocabulary kind {kind!r}; kinds: {', '.join(KINDS)}")
    content = read_label_file(path)
    id_filter = None
    if id_classes is not None:
        id_filter = IdFilter(id_classes.names, id_classes.wnids, packaged_lexicon() if lexicon is None else lexicon)
    per_class: dict[str, list[str]] | None = None
    ranked: dict[str, list[str]] | None = None
    dropped: list[str] = []

    def clean(labels: Sequence[str]) -> list[str]:
        kept = dedupe(_strip_prompt(lbl)[0] if strip_prompts else lbl for lbl in labels)
        if id_filter is not None:
            kept, gone = id_filter.keep(kept)
            dropped.extend(gone)
        return kept

    if isinstance(content, dict):
        class_names = (
            {normalize_label(n): key for n, key in zip(id_classes.names, class_keys(id_classes), strict=True)}
            if id_classes is not None
            else {}
        )
        matched = [key for key in content if normalize_label(key) in class_names]
        if class_names and len(matched) >= max(1, len(content) // 2):
            per_class = {
                class_names[normalize_label(key)]: clean(values)
                for key, values in content.items()
                if normalize_label(key) in class_names
            }
        else:
            content = [label for values in content.values() for label in values]
    if per_class is None:
        raw = list(content)  # type: ignore[arg-type]
        positions = [_strip_prompt(lbl)[1] for lbl in raw] if strip_prompts else [None] * len(raw)
        if kind == "wordnet" and raw and all(p is not None for p in positions):
            ranked = {
                NOUN: clean([label for label, p in zip(raw, positions, strict=True) if p == NOUN]),
                ADJECTIVE: clean([label for label, p in zip(raw, positions, strict=True) if p == ADJECTIVE]),
            }
        labels = clean(raw)
    params: dict[str, Any] = {
        "imported_from": Path(path).name,
        "strip_prompts": strip_prompts,
        "id_classes": id_classes.hash if id_classes is not None else None,
    }
    if ranked is not None:
        params["m"] = len(ranked[NOUN]) + len(ranked[ADJECTIVE])
    if per_class is not None:
        params["k"] = int(k) if k is not None else max((len(v) for v in per_class.values()), default=0)
    vocab = Vocabulary(
        name=name,
        kind=kind,
        labels=[],
        params=params,
        ranked=ranked,
        per_class=per_class,
        provenance={
            "source": f"imported from {Path(path).resolve()}",
            "dropped_id_names_or_synonyms": sorted(set(dropped)),
            "id_classes": id_classes.describe() if id_classes is not None else None,
        },
    )
    vocab.labels = vocab.select() if (ranked is not None or per_class is not None) else labels
    if not vocab.labels:
        if dropped:
            raise ZeroShotError(
                f"{path}: every label is an ID class name or one of its WordNet synonyms ({len(set(dropped))} "
                "dropped), so the vocabulary would be empty"
            )
        raise ZeroShotError(f"{path} holds no labels")
    return vocab


def oracle_labels_from_store(store: Any, model_id: str, dataset_id: str) -> list[str]:
    """Class names recorded for an OOD store entry (folder datasets record their class sub-folders)."""
    meta = store.meta(model_id, dataset_id)
    names = (meta.get("dataset") or {}).get("class_names")
    if not names:
        raise ZeroShotError(
            f"store entry {model_id}/{dataset_id} records no class names; give the OOD set's labels "
            "as a file (--labels FILE) instead"
        )
    return list(names)


def build_oracle(
    labels_by_source: Mapping[str, Sequence[str]],
    id_classes: ClassList,
    *,
    name: str = "oracle",
    lexicon: Lexicon | None = None,
) -> Vocabulary:
    """The oracle: the benchmark's own OOD class names as negatives — a non-deployable lower bound."""
    if not labels_by_source:
        raise ZeroShotError("the oracle needs the OOD sets' labels: give label files or store entries")
    id_filter = IdFilter(id_classes.names, id_classes.wnids, packaged_lexicon() if lexicon is None else lexicon)
    labels, dropped = id_filter.keep(label for labels in labels_by_source.values() for label in labels)
    if not labels:
        raise ZeroShotError("no OOD labels are left after removing ID names and their synonyms")
    return Vocabulary(
        name=name,
        kind="oracle",
        labels=labels,
        deployable=False,
        params={"sources": sorted(labels_by_source), "id_classes": id_classes.hash},
        provenance={
            "source": "OOD test-set labels (oracle, non-deployable lower bound)",
            "counts": {src: len(v) for src, v in labels_by_source.items()},
            "dropped_id_names_or_synonyms": dropped,
            "id_classes": id_classes.describe(),
        },
    )
