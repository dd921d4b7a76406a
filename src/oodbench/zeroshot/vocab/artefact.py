"""Vocabularies as versioned artefacts: labels, the data to re-select them at another size, parameters, provenance, hash.

A vocabulary directory holds one folder per vocabulary name and one JSON file per version,
``<root>/<name>/v<NNN>-<hash12>.json``. Saving content that is already stored returns the existing version (the
cache); different content under the same name becomes the next version. The hash covers everything that
determines the labels (kind, labels, rankings, per-class lists, parameters) and is checked on every load.

A vocabulary is data. Names must match the name rule (`oodbench.core.names`) in full, so ``NAME`` and
``NAME@vN`` never reach outside the directory. Name folders and artefacts inside it are opened without following
a link (a name folder through its descriptor) and without blocking on a FIFO, their size checked before reading;
every field of an artefact is checked for type and form (`Vocabulary.from_json`). Anything else is one
`ZeroShotError` line.
"""

from __future__ import annotations

import datetime as _dt
import errno
import hashlib
import json
import math
import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...core.errors import ZeroShotError
from ...core.names import check_name, is_name
from ...util.atomic import atomic_write_text, file_kind, open_regular, read_file_bytes
from ...util.schema import Int, ListOf, MapOf, Nullable, Record, SchemaError, Str, validate
from .labels import dedupe

__all__ = ["Vocabulary", "VocabStore", "KINDS", "NOUN", "ADJECTIVE", "split_prefix"]

FORMAT_VERSION = 1
# kind -> column of the Fi-ImageNet-1k paper's Table 2 it feeds.
KINDS = {
    "wordnet": "WN",
    "siblings": "LLM siblings",
    "union": "WN+LLM",
    "oracle": "oracle",
    "eoe": "EOE",
    "custom": "custom",
}
NOUN, ADJECTIVE = "noun", "adjective"
_FILE = re.compile(r"^v(\d{3,})-([0-9a-f]{12})\.json\Z")
MAX_BYTES = 256 * 2**20  # an artefact's size, checked before reading (a full WordNet ranking is a few MiB)
MAX_DEPTH = 32  # JSON nesting (params and provenance are the only free-form parts)
_MAX_VERSION = 10**9

# Every field of an artefact (`Vocabulary.to_json`); params and provenance are free-form JSON, checked by `_plain`.
_LABELS = ListOf(str)
_SCHEMA = Record(
    required={"name": str, "kind": str, "labels": _LABELS},
    optional={
        "format": Int(FORMAT_VERSION, FORMAT_VERSION),
        "version": Nullable(Int(1, _MAX_VERSION)),
        "hash": Nullable(Str(r"[0-9a-f]{64}")),
        "size": Int(0),
        "ranked": Nullable(MapOf(_LABELS, key=Str(f"{NOUN}|{ADJECTIVE}"))),
        "per_class": Nullable(MapOf(_LABELS)),
        "params": Nullable(
            Record(required={}, optional={"m": Nullable(Int(0, 2**40)), "k": Nullable(Int(0, 2**40))}, open=True)
        ),
        "provenance": Nullable(dict),
        "deployable": bool,
    },
)


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def split_prefix(num_nouns: int, num_adjectives: int, m: int) -> tuple[int, int]:
    """How many of the top nouns and adjectives make a prefix of size m (shared fraction, as NegLabel's top-k ratio)."""
    total = num_nouns + num_adjectives
    if isinstance(m, bool) or not isinstance(m, int) or m < 0:
        raise ZeroShotError(f"m must be a non-negative integer; got {m!r}")
    if m > total:
        raise ZeroShotError(f"asked for M={m} negatives but only {total} ranked candidates exist")
    nouns = min(num_nouns, int(round(m * num_nouns / total))) if total else 0
    return nouns, m - nouns


@dataclass
class Vocabulary:
    """A label vocabulary (negatives or outliers) with everything needed to rebuild, resize and trace it."""

    name: str
    kind: str
    labels: list[str]
    params: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)
    ranked: dict[str, list[str]] | None = None  # wordnet/union: candidates per part of speech, farthest first
    per_class: dict[str, list[str]] | None = None  # siblings/union: ID class -> siblings in seeded random order
    deployable: bool = True
    version: int | None = None

    def __post_init__(self) -> None:
        if not is_name(self.name, allow_at=False):
            raise ZeroShotError(f"invalid vocabulary name {self.name!r}: use letters, digits and . _ + = , -")
        if self.kind not in KINDS:
            raise ZeroShotError(f"unknown vocabulary kind {self.kind!r}; kinds: {', '.join(KINDS)}")
        if self.kind == "oracle":
            self.deployable = False
        self.labels = list(self.labels)

    def __len__(self) -> int:
        return len(self.labels)

    def __repr__(self) -> str:
        return f"Vocabulary({self.name!r}, kind={self.kind!r}, {len(self)} labels, hash={self.hash[:12]})"

    # ----------------------------------------------------------------- identity
    def content(self) -> dict[str, Any]:
        """The fields the hash covers."""
        return {
            "kind": self.kind,
            "labels": self.labels,
            "ranked": self.ranked,
            "per_class": self.per_class,
            "params": self.params,
            "deployable": self.deployable,
        }

    @property
    def hash(self) -> str:
        """SHA-256 of the canonical JSON of `content()`."""
        canonical = json.dumps(self.content(), sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()

    @property
    def ref(self) -> str:
        """'name@v<N>' once stored, else 'name'."""
        return f"{self.name}@v{self.version}" if self.version is not None else self.name

    # ----------------------------------------------------------------- resizing (sweeps)
    def select(self, *, m: int | None = None, k: int | None = None) -> list[str]:
        """Labels at WordNet prefix size `m` and/or `k` siblings per class (defaults: the vocabulary's own m and k).

        Vocabularies without a ranking or per-class lists return their labels.
        """
        if self.ranked is None and self.per_class is None and m is None and k is None:
            return list(self.labels)
        if m is not None and self.ranked is None:
            raise ZeroShotError(f"vocabulary {self.name!r} ({self.kind}) has no WordNet ranking: M cannot be varied")
        if k is not None and self.per_class is None:
            raise ZeroShotError(f"vocabulary {self.name!r} ({self.kind}) has no per-class lists: k cannot be varied")
        parts: list[str] = []
        if self.ranked is not None:
            size = m if m is not None else int(self.params.get("m") or 0)
            nouns, adjectives = split_prefix(len(self.ranked.get(NOUN, [])), len(self.ranked.get(ADJECTIVE, [])), size)
            parts += self.ranked.get(NOUN, [])[:nouns] + self.ranked.get(ADJECTIVE, [])[:adjectives]
        if self.per_class is not None:
            per = k if k is not None else int(self.params.get("k") or 0)
            if per < 0:
                raise ZeroShotError(f"k must be non-negative; got {per}")
            parts += [label for siblings in self.per_class.values() for label in siblings[:per]]
        return dedupe(parts)

    # ----------------------------------------------------------------- serialisation
    def to_json(self) -> dict[str, Any]:
        """The artefact as a JSON-ready dict (with its hash)."""
        return {
            "format": FORMAT_VERSION,
            "name": self.name,
            "version": self.version,
            "hash": self.hash,
            "size": len(self.labels),
            **self.content(),
            "provenance": self.provenance,
        }

    @classmethod
    def from_json(cls, data: Any, *, origin: str = "") -> Vocabulary:
        """Rebuild from `to_json` output, checking every field's type and form and verifying the recorded hash.

        Anything else (a list, a missing or unknown field, labels that are not strings, a non-finite number, params
        or provenance nested deeper than `MAX_DEPTH`) is one `ZeroShotError` line naming the field.
        """
        where = origin or "vocabulary"
        try:
            validate(_SCHEMA, data)
            for key in ("params", "provenance"):
                _plain(data.get(key), key)
        except SchemaError as exc:
            raise ZeroShotError(f"{where} is not a vocabulary artefact: {exc}"[:400]) from None
        check_name(data["name"], f"{where}: name", error=ZeroShotError, allow_at=False)
        if data["kind"] not in KINDS:
            raise ZeroShotError(f"{where}: unknown vocabulary kind {data['kind']!r:.60}; kinds: {', '.join(KINDS)}")
        vocab = cls(
            name=data["name"],
            kind=data["kind"],
            labels=list(data["labels"]),
            params=dict(data.get("params") or {}),
            provenance=dict(data.get("provenance") or {}),
            ranked=data.get("ranked"),
            per_class=data.get("per_class"),
            deployable=data.get("deployable", True),
            version=data.get("version"),
        )
        recorded = data.get("hash")
        if recorded is not None and recorded != vocab.hash:
            raise ZeroShotError(
                f"{origin or vocab.name}: content does not match its recorded hash "
                f"({recorded[:12]} vs {vocab.hash[:12]}); the file was edited or is corrupt"
            )
        if "size" in data and data["size"] != len(data["labels"]):
            raise ZeroShotError(f"{where}: size {data['size']} but {len(data['labels'])} labels")
        return vocab


def _plain(value: Any, where: str) -> None:
    """Raise `SchemaError` unless `value` is plain JSON: objects with string keys, lists, strings, booleans, null,
    integers and finite numbers, nested at most `MAX_DEPTH` levels (checked without recursion)."""
    stack = [(value, where, 1)]
    while stack:
        item, at, level = stack.pop()
        if level > MAX_DEPTH:
            raise SchemaError(f"{at}: nested deeper than {MAX_DEPTH} levels")
        if isinstance(item, dict):
            for key, sub in item.items():
                if not isinstance(key, str):
                    raise SchemaError(f"{at}: expected string keys, got {key!r:.60}")
                stack.append((sub, f"{at}.{key}", level + 1))
        elif isinstance(item, list):
            stack.extend((sub, f"{at}[{i}]", level + 1) for i, sub in enumerate(item))
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise SchemaError(f"{at}: expected a finite number, got {item!r}")
        elif item is not None and not isinstance(item, (str, int)):  # bool is an int
            raise SchemaError(f"{at}: expected a JSON value, got a {type(item).__name__}")


def _finite_float(token: str) -> float:
    value = float(token)
    if not math.isfinite(value):
        raise ValueError(f"{token} is out of range")
    return value


def _refuse_constant(token: str) -> None:
    raise ValueError(f"{token} is not JSON")


def _parse(data: bytes, origin: str) -> Any:
    """The JSON value of an artefact's bytes, or one `ZeroShotError` line (not UTF-8, malformed, NaN, too deep)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ZeroShotError(
            f"cannot read vocabulary {origin}: not UTF-8 text ({exc.reason} at byte {exc.start})"
        ) from None
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except RecursionError:
        raise ZeroShotError(f"cannot read vocabulary {origin}: JSON nested too deeply") from None
    except ValueError as exc:
        raise ZeroShotError(f"cannot read vocabulary {origin}: not valid JSON ({exc})"[:400]) from None


class VocabStore:
    """A directory of versioned vocabulary artefacts."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"VocabStore({str(self.root)!r})"

    def _folder(self, name: str) -> int | None:
        """A descriptor of the folder of `name` (a valid name), or None when there is none.

        The folder must be a directory inside the root, not a link (to anywhere); the descriptor pins it, so a
        later swap for a link changes nothing. Anything else there is one line.
        """
        check_name(name, "vocabulary name", error=ZeroShotError, allow_at=False)
        path = self.root / name
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ZeroShotError(f"cannot read vocabulary folder {path}: {exc.strerror or exc}") from None
        if not stat.S_ISDIR(info.st_mode):
            raise ZeroShotError(
                f"vocabulary folder {path} is {file_kind(info.st_mode)}, not a directory; it is not followed or read"
            )
        try:
            return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as exc:
            what = "a symbolic link, not followed" if exc.errno in (errno.ELOOP, errno.ENOTDIR) else exc.strerror
            raise ZeroShotError(f"cannot read vocabulary folder {path}: {what or exc}") from None

    def _versions(self, name: str) -> list[tuple[int, str, Path]]:
        folder = self._folder(name)
        if folder is None:
            return []
        try:
            entries = os.listdir(folder)
        except OSError as exc:
            raise ZeroShotError(f"cannot read vocabulary folder {self.root / name}: {exc.strerror or exc}") from None
        finally:
            os.close(folder)
        found = [(int(m[1]), m[2], self.root / name / f) for f in entries if (m := _FILE.match(f))]
        return sorted(found)

    def names(self) -> list[str]:
        """Vocabulary names with at least one stored version (a link where a name folder belongs is refused)."""
        if not self.root.is_dir():
            return []
        try:
            entries = sorted(os.scandir(self.root), key=lambda e: e.name)
        except OSError as exc:
            raise ZeroShotError(f"cannot read vocabulary directory {self.root}: {exc.strerror or exc}") from None
        found = []
        for entry in entries:
            if not is_name(entry.name, allow_at=False):
                continue  # not a vocabulary (the LLM cache, temporaries)
            if entry.is_symlink():
                raise ZeroShotError(
                    f"vocabulary folder {entry.path} is a symbolic link; it is not followed (move the folder itself there)"
                )
            if entry.is_dir(follow_symlinks=False) and self._versions(entry.name):
                found.append(entry.name)
        return found

    def save(self, vocab: Vocabulary) -> Vocabulary:
        """Store `vocab` (a new version unless identical content is stored); returns it with its version set."""
        check_name(vocab.name, "vocabulary name", error=ZeroShotError, allow_at=False)
        digest = vocab.hash
        versions = self._versions(vocab.name)  # refuses a name folder that is a link or not a directory
        for _number, short, path in versions:
            if short == digest[:12]:
                return self._read(path)
        vocab.version = (versions[-1][0] + 1) if versions else 1
        vocab.provenance.setdefault("created", _now())
        path = self.root / vocab.name / f"v{vocab.version:03d}-{digest[:12]}.json"
        atomic_write_text(path, json.dumps(vocab.to_json(), indent=1, ensure_ascii=False, default=str) + "\n")
        return vocab

    def _read(self, path: Path) -> Vocabulary:
        """The stored artefact at `path` (``<root>/<name>/<file>``): a regular file reached through the name
        folder's descriptor, never through a link, its size checked before reading, its content checked against
        its file name (name, version, hash)."""
        name, file = path.parent.name, path.name
        match = _FILE.match(file)
        if match is None:
            raise ZeroShotError(f"{path} is not named like a stored vocabulary (v<NNN>-<hash12>.json)")
        folder = self._folder(name)
        if folder is None:
            raise ZeroShotError(f"cannot read vocabulary {path}: its folder is gone")
        try:  # a regular file, never through a link, checked on the opened descriptor
            fd = open_regular(file, dir_fd=folder)
        except OSError as exc:
            raise ZeroShotError(f"cannot read vocabulary {path}: {exc.strerror or exc}") from None
        finally:
            os.close(folder)
        size = os.fstat(fd).st_size
        if size > MAX_BYTES:
            os.close(fd)
            raise ZeroShotError(f"cannot read vocabulary {path}: {size:,} bytes, more than the {MAX_BYTES:,} allowed")
        with os.fdopen(fd, "rb") as handle:
            try:
                data = handle.read(MAX_BYTES + 1)
            except OSError as exc:
                raise ZeroShotError(f"cannot read vocabulary {path}: {exc.strerror or exc}") from None
        if len(data) > MAX_BYTES:
            raise ZeroShotError(f"cannot read vocabulary {path}: it grew beyond {MAX_BYTES:,} bytes while read")
        vocab = Vocabulary.from_json(_parse(data, str(path)), origin=str(path))
        number, short = int(match[1]), match[2]
        if vocab.name != name:
            raise ZeroShotError(f"{path}: holds vocabulary {vocab.name!r}, not {name!r}; the file was moved or edited")
        if vocab.version not in (None, number):
            raise ZeroShotError(f"{path}: records version {vocab.version}, not {number} as its file name says")
        if vocab.hash[:12] != short:
            raise ZeroShotError(
                f"{path}: content hash {vocab.hash[:12]} does not match its file name; the file was edited or is corrupt"
            )
        vocab.version = number
        return vocab

    def _read_named_file(self, ref: str) -> Vocabulary:
        """A .json artefact a user named by path (a link they made is followed; a FIFO or device is refused)."""
        try:
            data = read_file_bytes(ref, MAX_BYTES)
        except ValueError as exc:
            raise ZeroShotError(f"cannot read vocabulary {ref}: {exc}") from None
        return Vocabulary.from_json(_parse(data, ref), origin=ref)

    def load(self, ref: str) -> Vocabulary:
        """'name' (latest version), 'name@v3' or 'name@<hash prefix>'; a path to a .json artefact also works.

        The name must match the name rule in full (it becomes a folder name): ``../elsewhere`` is refused.
        """
        if not isinstance(ref, str):
            raise ZeroShotError(f"a vocabulary reference is a string 'NAME[@vN]'; got {ref!r:.60}")
        if ref.endswith(".json") and os.path.exists(ref) and not os.path.isdir(ref):
            return self._read_named_file(ref)
        name, _, wanted = ref.partition("@")
        check_name(name, "vocabulary", error=ZeroShotError, allow_at=False)
        versions = self._versions(name)
        if not versions:
            known = ", ".join(self.names()) or "none"
            raise ZeroShotError(f"no vocabulary {name!r} in {self.root} (stored: {known}); build or import it first")
        if not wanted:
            return self._read(versions[-1][2])
        for number, short, path in versions:
            if wanted in (f"v{number}", f"v{number:03d}") or (len(wanted) >= 4 and short.startswith(wanted)):
                return self._read(path)
        raise ZeroShotError(
            f"vocabulary {name!r} has no version {wanted!r:.80}; versions: "
            + ", ".join(f"v{n} ({s})" for n, s, _ in versions)
        )

    def summaries(self) -> list[dict[str, Any]]:
        """One summary per stored version: name, version, hash, kind, size, deployable, created."""
        rows = []
        for name in self.names():
            for number, short, path in self._versions(name):
                vocab = self._read(path)
                rows.append(
                    {
                        "name": name,
                        "version": number,
                        "hash": short,
                        "kind": vocab.kind,
                        "size": len(vocab),
                        "deployable": vocab.deployable,
                        "created": vocab.provenance.get("created", ""),
                        "source": vocab.provenance.get("source", ""),
                    }
                )
        return rows

    def load_many(self, refs: Sequence[str]) -> list[Vocabulary]:
        """Several vocabularies; 'all' stands for the latest version of every stored name."""
        expanded: list[str] = []
        for ref in refs:
            expanded.extend(self.names() if ref == "all" else [ref])
        return [self.load(ref) for ref in dict.fromkeys(expanded)]
