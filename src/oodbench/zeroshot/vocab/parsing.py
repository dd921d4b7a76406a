"""Robust parsing of category-name lists out of free-form LLM replies.

Accepted shapes, tried in order: a JSON array of strings (or an object whose values are such arrays), possibly
inside a Markdown code fence or surrounded by prose; else one name per line with bullets or numbering
(``-``, ``*``, ``•``, ``1.``, ``2)``, ``(3)``), where a trailing explanation after `` - ``, `` – ``, ``:`` or
`` (`` is cut; else a single line of three or more comma- or semicolon-separated names. Preambles ("Here are 20 ...:"), headings and
sentences (four or more words ending in . ! ?) or names longer than `max_words` words are dropped.
"""

from __future__ import annotations

import json
import re

from ...text.classes import normalize_label
from ...text.llm import json_depth_ok

__all__ = ["parse_name_list"]

_FENCE = re.compile(r"```[A-Za-z0-9_-]*\s*(.*?)```", re.S)
_BULLET = re.compile(r"^\s*(?:[-*•+]|\(?\d{1,4}[.):]|\d{1,4}\s*-|[a-zA-Z][.)])\s+")
_EXPLANATION = re.compile(r"\s+(?:-|–|—)\s+|:\s+|\s+\(")
_HEADING = re.compile(r"^\s*#+\s|:\s*$")
_SENTENCE = re.compile(r"[.!?]$")


def _json_names(text: str) -> list[str] | None:
    """Names from the first JSON array/object in `text` that holds strings, or None (also for absurdly deep nesting,
    which would exhaust the parser's stack)."""
    if not json_depth_ok(text):
        return None
    decoder = json.JSONDecoder()
    for start, char in enumerate(text):
        if char not in "[{":
            continue
        try:
            value, _ = decoder.raw_decode(text[start:])
        except json.JSONDecodeError:
            continue
        names: list[str] = []
        if isinstance(value, list):
            names = [v for v in value if isinstance(v, str)]
        elif isinstance(value, dict):
            for item in value.values():
                if isinstance(item, list):
                    names.extend(v for v in item if isinstance(v, str))
                elif isinstance(item, str):
                    names.append(item)
        if names:
            return names
    return None


def _line_names(text: str, max_words: int) -> list[str]:
    lines = [line for line in text.splitlines() if line.strip()]
    names: list[str] = []
    bulleted = [line for line in lines if _BULLET.match(line)]
    # With a bulleted or numbered list present, the other lines are prose around it.
    for line in bulleted or lines:
        if _HEADING.search(line) and not _BULLET.match(line):
            continue
        item = _BULLET.sub("", line, count=1).strip().strip("*_`\"'")
        if _SENTENCE.search(item) and len(item.split()) >= 4:
            continue  # prose ("I cannot list those.", "Let me know if you need more!")
        item = _EXPLANATION.split(item, maxsplit=1)[0]
        if len(item.split()) <= max_words:
            names.append(item)
    if len(names) <= 1 and not bulleted:
        parts = re.split(r"[;,]", " ".join(lines))
        # Three or more short parts make a list; "Sorry, I cannot do that." does not.
        if len(parts) >= 3 and all(len(part.split()) <= max_words for part in parts):
            names = parts
    return names


def parse_name_list(text: str, *, max_words: int = 6, max_names: int | None = None) -> list[str]:
    """Normalised, de-duplicated category names found in an LLM reply (possibly empty), the first `max_names`."""
    if not isinstance(text, str):
        return []
    fenced = _FENCE.findall(text)
    candidates = _json_names("\n".join(fenced)) if fenced else None
    if candidates is None:
        candidates = _json_names(text)
    if candidates is None:
        candidates = _line_names("\n".join(fenced) if fenced else text, max_words)
    names: dict[str, None] = {}
    for raw in candidates:
        name = normalize_label(re.sub(r"\s*\[[^\]]*\]\s*", " ", raw))
        if name and len(name.split()) <= max_words and not name.isdigit():
            names.setdefault(name, None)
            if max_names is not None and len(names) >= max_names:
                break
    return list(names)
