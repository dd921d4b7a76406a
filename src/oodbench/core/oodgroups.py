"""OOD groups (near / far, or any a user defines) as data: a TOML file of group -> member dataset ids.

A groups file::

    title = "OpenOOD v1.5, ImageNet-1k"
    [groups]
    near = ["ssb-hard", "ninco"]
    far = ["inaturalist", "textures", "openimage-o"]
    [aliases]                      # optional: other ids a member may have in a store
    inaturalist = ["inat-ood-plants"]
    [covariate_shift]              # optional: the benchmark's covariate-shifted ID sets
    datasets = ["imagenet-v2", "imagenet-r"]

Ids match case-insensitively, with ``_`` and spaces read as ``-``. Loading reads the file and nothing else. The
shipped files live in ``oodbench/data/groups`` and are named by their stem (``openood-v1.5-imagenet``).
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from .errors import OodbenchError

__all__ = ["OodGroups", "Arrangement", "DEFAULT_GROUPS", "shipped_groups", "load_groups", "normalise"]

DEFAULT_GROUPS = "openood-v1.5-imagenet"  # the groups of `--convention openood` unless `--groups` says otherwise


def normalise(dataset: str) -> str:
    """The form ids are compared in: lower case, '_' and ' ' as '-'."""
    return dataset.strip().lower().replace("_", "-").replace(" ", "-")


@dataclass(frozen=True)
class Arrangement:
    """OOD sets of a run in group order: (group, present sets, members not present) per group, then the rest."""

    groups: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...]
    ungrouped: tuple[str, ...]

    def present(self) -> list[tuple[str, tuple[str, ...], tuple[str, ...]]]:
        """Groups with at least one set present."""
        return [g for g in self.groups if g[1]]


@dataclass(frozen=True)
class OodGroups:
    """Named groups of OOD dataset ids, their aliases, and the benchmark's covariate-shifted ID sets."""

    title: str
    groups: dict[str, tuple[str, ...]]
    aliases: dict[str, str]  # normalised id -> member id
    covariate_shift: tuple[str, ...] = ()
    source: str = ""

    def member(self, dataset: str) -> str | None:
        """The member id `dataset` stands for (itself or through an alias), or None."""
        key = normalise(dataset)
        return self.aliases.get(key)

    def arrange(self, ood_datasets: list[str] | tuple[str, ...]) -> Arrangement:
        """The run's OOD sets in group order (each group in the file's member order), the others after."""
        by_member = {}
        for dataset in ood_datasets:
            member = self.member(dataset)
            if member is not None and member not in by_member:
                by_member[member] = dataset
        groups = tuple(
            (
                name,
                tuple(by_member[m] for m in members if m in by_member),
                tuple(m for m in members if m not in by_member),
            )
            for name, members in self.groups.items()
        )
        placed = set(by_member.values())
        return Arrangement(groups, tuple(d for d in ood_datasets if d not in placed))


def shipped_groups() -> list[str]:
    """Names of the groups files oodbench ships."""
    folder = resources.files("oodbench") / "data" / "groups"
    return sorted(entry.name.removesuffix(".toml") for entry in folder.iterdir() if entry.name.endswith(".toml"))


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise OodbenchError(f"{where} must be a list of dataset ids (non-empty strings)")
    return tuple(v.strip() for v in value)


def load_groups(spec: str | os.PathLike[str]) -> OodGroups:
    """A shipped groups file by name (``openood-v1.5-imagenet``) or a groups TOML file by path."""
    text: str
    path = Path(spec)
    if str(spec) in shipped_groups():
        text = (resources.files("oodbench") / "data" / "groups" / f"{spec}.toml").read_text(encoding="utf-8")
        source = f"shipped: {spec}"
    elif path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise OodbenchError(f"cannot read groups file {path}: {exc}") from None
        source = str(path)
    else:
        raise OodbenchError(
            f"no groups file {str(spec)!r}: give a TOML file or one of the shipped: {', '.join(shipped_groups())}"
        )
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise OodbenchError(f"groups file {source}: not valid TOML: {exc}") from None
    unknown = sorted(set(data) - {"title", "groups", "aliases", "covariate_shift"})
    if unknown:
        raise OodbenchError(f"groups file {source}: unknown keys {unknown}; expected title, groups, aliases")
    raw = data.get("groups")
    if not isinstance(raw, dict) or not raw:
        raise OodbenchError(f"groups file {source}: needs a [groups] table of name = [dataset ids]")
    groups = {str(name): _strings(members, f"groups file {source}: group {name!r}") for name, members in raw.items()}
    aliases: dict[str, str] = {}
    for name, members in groups.items():
        for member in members:
            key = normalise(member)
            if key in aliases:
                raise OodbenchError(
                    f"groups file {source}: {member!r} is in group {name!r} and already in another group"
                )
            aliases[key] = member
    for member, others in (data.get("aliases") or {}).items():
        target = aliases.get(normalise(member))
        if target is None:
            raise OodbenchError(f"groups file {source}: alias of {member!r}, which is in no group")
        for alias in _strings(others, f"groups file {source}: aliases of {member!r}"):
            if aliases.get(normalise(alias), target) != target:
                raise OodbenchError(f"groups file {source}: alias {alias!r} names two members")
            aliases[normalise(alias)] = target
    shift = data.get("covariate_shift") or {}
    if not isinstance(shift, dict) or set(shift) - {"datasets"}:
        raise OodbenchError(f"groups file {source}: [covariate_shift] holds one key, datasets = [ids]")
    covariate = _strings(shift["datasets"], f"groups file {source}: covariate_shift.datasets") if shift else ()
    title = data.get("title", str(spec))
    if not isinstance(title, str):
        raise OodbenchError(f"groups file {source}: title must be a string")
    return OodGroups(title, groups, aliases, covariate, source)
