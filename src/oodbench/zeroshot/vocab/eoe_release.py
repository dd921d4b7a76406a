"""EOE outlier lists generated with EOE's released prompts and protocol, the prompts read from a user-given file.

The Fi-ImageNet-1k paper uses the three prompts released with EOE (Appendix G, "EOE OOD method"; Table A4 and the
paragraph "EOE prompt style"): far-OOD, near-OOD and fine-grained, 500 generated categories. The authors' repository
(Aboriginer/EOE, the same history as tmlr-group/EOE) declares no licence, so oodbench does not ship the prompt texts:
the user gives them in a prompt file (`load_prompt_file`), and oodbench runs the released protocol around them:

- **far / fine-grained**: one conversation per generation; the first request asks for 50 names, then ``size / 50 − 1``
  follow-up requests (the file's ``again`` text) in the same conversation, each reply appended as the assistant's turn;
- **near**: one request per ID class asking for ``per_class`` names (the class name with ``_`` as a space);
- **replies**: the names are the lines that start with ``- `` (the release's reply format); then lower-cased,
  de-duplicated (first occurrence kept; the release's unordered set gives the same set, and the EOE score, a maximum
  over the outliers, does not depend on the order) and those equal to an ID name dropped; for near, also every name
  that shares a word with an ID name (the release drops those at evaluation time).

Placeholders in the prompt texts (the release's field names): ``{num_classes}``, ``{class_type}``, ``{class_info}``
(the semicolon-separated ID names, as the paper states, or the one class name for near) and ``{envision_nums}``.
They are replaced literally; nothing in the file is evaluated.
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...core.errors import ZeroShotError
from ...text.classes import ClassList
from ...text.llm import ChatClient, Messages
from .artefact import Vocabulary
from .eoe import EOE_TASKS

__all__ = [
    "STYLES",
    "PLACEHOLDERS",
    "BATCH",
    "DEFAULT_NAMES",
    "ReleasedPrompts",
    "load_prompt_file",
    "release_names",
    "generate_released_eoe",
]

STYLES = EOE_TASKS  # the released prompt styles are EOE's three tasks
PLACEHOLDERS = ("num_classes", "class_type", "class_info", "envision_nums")
# Vocabulary names: the fine-grained list is Table 2's EOE column, so it takes the plain name the tables use.
DEFAULT_NAMES = {"far": "eoe-far", "near": "eoe-near", "fine_grained": "eoe"}
BATCH = 50  # names asked for per request in a far / fine-grained conversation, as released
_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True)
class ReleasedPrompts:
    """The prompt texts of one file: per style its first request and (far / fine-grained) its follow-up."""

    path: str
    sha256: str
    source: str
    prompts: dict[str, dict[str, str]]

    def render(self, style: str, part: str, **values: Any) -> str:
        """One prompt with its placeholders replaced literally."""
        text = self.prompts[style][part]
        for name in PLACEHOLDERS:
            if "{" + name + "}" in text:
                if values.get(name) is None:
                    raise ZeroShotError(f"the {style} prompt of {self.path} uses {{{name}}}; give its value")
                text = text.replace("{" + name + "}", str(values[name]))
        return text


def load_prompt_file(path: str | Path) -> ReleasedPrompts:
    """Read a prompt file (TOML or JSON: ``[far] prompt/again``, ``[near] prompt``, ``[fine_grained] prompt/again``)."""
    file = Path(path)
    try:
        raw = file.read_bytes()
    except OSError as exc:
        raise ZeroShotError(f"cannot read the EOE prompt file {file}: {exc.strerror or exc}") from None
    try:
        data = json.loads(raw) if file.suffix.lower() == ".json" else tomllib.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        kind = "JSON" if file.suffix.lower() == ".json" else "TOML"
        raise ZeroShotError(f"{file} is not a valid {kind} file: {exc}") from None
    if not isinstance(data, dict):
        raise ZeroShotError(f"{file}: expected a table of prompt styles")
    unknown = sorted(set(data) - set(STYLES) - {"source"})
    if unknown:
        raise ZeroShotError(
            f"{file}: unknown key(s) {', '.join(unknown)}; styles are {', '.join(STYLES)} (and 'source')"
        )
    prompts: dict[str, dict[str, str]] = {}
    for style in STYLES:
        if style not in data:
            continue
        table = data[style]
        parts = ("prompt",) if style == "near" else ("prompt", "again")
        if not isinstance(table, dict) or set(table) != set(parts):
            raise ZeroShotError(f"{file}: [{style}] must hold exactly {' and '.join(parts)}")
        for part in parts:
            text = table[part]
            if not isinstance(text, str) or not text.strip():
                raise ZeroShotError(f"{file}: {style}.{part} must be a non-empty string")
            odd = sorted(set(_FIELD.findall(text)) - set(PLACEHOLDERS))
            if odd:
                raise ZeroShotError(
                    f"{file}: {style}.{part} has unknown placeholder(s) {', '.join('{' + o + '}' for o in odd)}; "
                    f"known: {', '.join('{' + p + '}' for p in PLACEHOLDERS)}"
                )
        prompts[style] = {part: table[part] for part in parts}
    if not prompts:
        raise ZeroShotError(f"{file}: no prompt style given ({', '.join(STYLES)})")
    source = data.get("source", "")
    if not isinstance(source, str):
        raise ZeroShotError(f"{file}: source must be a string")
    return ReleasedPrompts(str(file), hashlib.sha256(raw).hexdigest(), source, prompts)


def dash_lines(reply: str) -> list[str]:
    """The names of a reply in the released format: every line that starts with '- ', without it."""
    return [line[2:].strip() for line in reply.split("\n") if line.startswith("- ") and line[2:].strip()]


def release_names(replies: list[list[str]], id_names: list[str], *, style: str) -> tuple[list[str], list[str]]:
    """(kept, dropped) names after the release's rules: lower-case, de-duplicate, drop ID names (near: shared words)."""
    ids = {name.lower() for name in id_names}
    words = {word for name in ids for word in name.split()}
    kept: dict[str, None] = {}
    dropped: dict[str, None] = {}
    for names in replies:
        for name in names:
            lowered = name.lower()
            if lowered in ids or (style == "near" and any(word in words for word in lowered.split())):
                dropped[lowered] = None
            else:
                kept[lowered] = None
    return list(kept), [d for d in dropped if d not in kept]


def generate_released_eoe(
    id_classes: ClassList,
    client: ChatClient,
    prompts: ReleasedPrompts,
    *,
    style: str,
    size: int = 500,
    per_class: int = 3,
    class_type: str | None = None,
    generation: int = 0,
    workers: int = 4,
    name: str | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> Vocabulary:
    """An 'eoe' vocabulary from one generation of EOE's released protocol with the file's prompts for `style`."""
    if style not in STYLES:
        raise ZeroShotError(f"unknown EOE prompt style {style!r}; styles: {', '.join(STYLES)}")
    if style not in prompts.prompts:
        raise ZeroShotError(f"{prompts.path} has no [{style}] prompt")
    if size < BATCH or size % BATCH:
        raise ZeroShotError(f"size must be a positive multiple of {BATCH} (the release asks {BATCH} names a request)")
    if per_class < 1 or generation < 0:
        raise ZeroShotError("per_class must be >= 1 and generation >= 0")
    names = list(id_classes.names)
    values = {"num_classes": len(names), "class_type": class_type, "class_info": "; ".join(names)}
    accept = lambda reply: bool(dash_lines(reply))  # noqa: E731 - an unusable reply is never cached
    rendered: list[str] = []
    if style == "near":
        requests: list[tuple[Messages, int]] = []
        for id_name in names:
            one = {**values, "class_info": id_name.replace("_", " "), "envision_nums": per_class}
            requests.append(([{"role": "user", "content": prompts.render("near", "prompt", **one)}], generation))
        rendered.append(requests[0][0][0]["content"])
        replies = client.complete_many(requests, accept=accept, workers=workers, on_done=on_progress)
        parsed = [dash_lines(reply) for reply in replies]
    else:
        conversation: Messages = [
            {"role": "user", "content": prompts.render(style, "prompt", **values, envision_nums=BATCH)}
        ]
        again = prompts.render(style, "again", **values, envision_nums=BATCH)
        rendered += [conversation[0]["content"], again]
        parsed = []
        for turn in range(size // BATCH):
            if turn:
                conversation = [*conversation, {"role": "user", "content": again}]
            reply = client.complete(conversation, generation=generation, accept=accept)
            parsed.append(dash_lines(reply))
            conversation = [*conversation, {"role": "assistant", "content": reply}]
            if on_progress is not None:
                on_progress(turn)
    labels, dropped = release_names(parsed, names, style=style)
    if not labels:
        raise ZeroShotError(
            f"the LLM gave no usable '- ' lines for the EOE {style} prompt; check the model and {client.cache_dir}"
        )
    return Vocabulary(
        name=name or DEFAULT_NAMES[style],
        kind="eoe",
        labels=labels,
        params={
            "task": style,
            "protocol": "released",
            "size": int(size),
            "per_class": int(per_class) if style == "near" else None,
            "class_type": class_type,
            "generation": int(generation),
            "prompt_file_sha256": prompts.sha256,
            "id_classes": id_classes.hash,
        },
        provenance={
            "source": "EOE (Cao et al., ICML 2024) released prompts and protocol, prompts from a user-given file",
            "prompt_file": prompts.path,
            "prompt_file_source": prompts.source,
            "prompts_rendered": rendered,
            "llm": client.config.public(),
            "id_classes": id_classes.describe(),
            "dropped_id_names": dropped,
            "requests": dict(client.stats),
            "replies_without_names": sum(not p for p in parsed),
        },
    )
