"""Packs on the Hugging Face Hub: push a verified pack to a dataset repository, pull only the entries asked for.

Everything goes through ``huggingface_hub`` (the ``hub`` extra): its token from its usual place (``HF_TOKEN`` or
the file ``hf auth login`` writes; oodbench stores nothing) and its endpoint (``HF_ENDPOINT``, read at each call).
A pull fetches the manifest first (its size bounded before the download), pins the revision to the manifest's
commit, downloads only the files of the chosen models and datasets (``huggingface_hub``'s ``http_get``, which
resumes from a given byte), keeps each unfinished file as ``.<name>.partial`` so that a rerun continues it, and
checks every file's SHA-256 against the manifest before it takes its place; a file that fails is deleted.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .errors import StoreError
from .pack import CARD, HEAD, MANIFEST, MAX_JSON_BYTES, Pack, PackSummary, _selection, verify_pack

__all__ = ["pack_cache", "pull_pack", "push_pack", "resolve_pack"]


def _hub() -> Any:
    try:
        import huggingface_hub
    except ImportError:
        raise StoreError(
            "pack push/pull need huggingface_hub: pip install 'oodbench[hub]' (or pip install huggingface_hub)"
        ) from None
    return huggingface_hub


def _endpoint() -> str | None:
    return os.environ.get("HF_ENDPOINT") or None


def _hub_error(action: str, repo_id: str, exc: Exception) -> StoreError:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return StoreError(f"{action} {repo_id}: {text}")


def push_pack(
    root: str | os.PathLike[str],
    repo_id: str,
    *,
    revision: str | None = None,
    private: bool | None = None,
    message: str | None = None,
    token: str | None = None,
) -> str:
    """Verify the whole pack, then upload it to the dataset repository `repo_id` in one commit; the commit URL."""
    hub = _hub()
    pack, summary, absent = verify_pack(root)
    if summary.problems:
        raise StoreError(f"not pushed: {summary.problems[0]}")
    if absent:
        raise StoreError(f"not pushed: the pack is partial ({', '.join(absent[:3])} not here); push a complete pack")
    names = [MANIFEST, CARD, *pack.files]
    for name in (MANIFEST, CARD):
        path = pack.root / name
        if path.is_symlink() or not path.is_file():
            raise StoreError(f"not pushed: {path} is not a regular file")
    api = hub.HfApi(endpoint=_endpoint(), token=token)
    operations = [hub.CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(pack.root / name)) for name in names]
    try:
        api.create_repo(repo_id, repo_type="dataset", exist_ok=True, private=private)
        info = api.create_commit(
            repo_id,
            operations,
            commit_message=message or f"oodbench pack: {len(summary.entries)} entries",
            repo_type="dataset",
            revision=revision,
        )
    except Exception as exc:  # the Hub client's errors (HTTP, authentication, network) end as one line
        raise _hub_error("cannot push to", repo_id, exc) from exc
    return str(info)


def pull_pack(
    repo_id: str,
    dest: str | os.PathLike[str],
    *,
    models: Sequence[str] = (),
    datasets: Sequence[str] = (),
    revision: str | None = None,
    token: str | None = None,
) -> PackSummary:
    """Download the manifest and the files of the chosen entries (with their models' heads) into `dest`.

    Each file is downloaded to ``.<name>.partial`` beside its place and renamed once its SHA-256 matches the
    manifest; an interrupted pull resumes: rerun it and each file continues from the bytes already on disk
    (an HTTP range request). A file whose SHA-256 differs is deleted.
    """
    import time

    hub = _hub()
    started = time.perf_counter()
    dest = Path(dest)
    endpoint = _endpoint()
    try:
        url = hub.hf_hub_url(repo_id, MANIFEST, repo_type="dataset", revision=revision, endpoint=endpoint)
        info = hub.get_hf_file_metadata(url, token=token, endpoint=endpoint)
        if info.size is None or info.size > MAX_JSON_BYTES:
            raise StoreError(
                f"{repo_id}: its {MANIFEST} is {info.size} bytes; a pack manifest is at most {MAX_JSON_BYTES:,}"
            )
        pinned = info.commit_hash or revision  # every file from the manifest's commit, whatever is pushed meanwhile
        dest.mkdir(parents=True, exist_ok=True)
        _download(hub, repo_id, MANIFEST, pinned, dest, info.size, None, token, endpoint)
    except StoreError:
        raise
    except Exception as exc:
        raise _hub_error("cannot pull the manifest of", repo_id, exc) from exc
    pack = Pack(dest)
    selected = _selection(pack, models, datasets)
    keys = list(selected)
    for model_id in sorted({m for m, _ in selected}):
        if pack.models[model_id].get("head") is not None:
            keys.append((model_id, HEAD))
    names = [name for key in keys for name in pack.files_of(*key)]
    try:
        _download(hub, repo_id, CARD, pinned, dest, None, None, token, endpoint)
        for name in names:
            _download(
                hub, repo_id, name, pinned, dest, pack.files[name]["size"], pack.files[name]["sha256"], token, endpoint
            )
    except StoreError:
        raise
    except Exception as exc:
        raise _hub_error("pull interrupted (rerun the same command to resume the download) from", repo_id, exc) from exc
    problems = pack.verify_entries(keys)
    if problems:
        raise StoreError(f"pulled files failed their checksums: {problems[0]}")
    summary = PackSummary(entries=[f"{m}/{d}" for m, d in keys])
    summary.nbytes = sum(pack.files[name]["size"] for name in names)
    summary.seconds = time.perf_counter() - started
    return summary


def _download(
    hub: Any,
    repo_id: str,
    name: str,
    revision: str | None,
    dest: Path,
    size: int | None,
    sha256: str | None,
    token: str | None,
    endpoint: str | None,
) -> None:
    """Fetch one file into `dest/name`, resuming its partial download; its SHA-256 checked when known."""
    import hashlib

    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers

    final = dest / name
    partial = final.parent / f".{final.name}.partial"
    if sha256 is not None and final.is_file() and not final.is_symlink() and final.stat().st_size == size:
        return  # pulled before; checked with the others at the end
    final.parent.mkdir(parents=True, exist_ok=True)
    for path in (final, partial):
        if path.is_symlink() or (path.exists() and not path.is_file()):
            raise StoreError(f"{path} exists and is not a regular file; not writing through it")
    done = partial.stat().st_size if partial.exists() else 0
    if size is not None and done > size:
        partial.unlink()
        done = 0
    url = hub.hf_hub_url(repo_id, name, repo_type="dataset", revision=revision, endpoint=endpoint)
    if size is None:  # the dataset card: not in the manifest, so its size comes from the server, bounded
        size = hub.get_hf_file_metadata(url, token=token, endpoint=endpoint).size
        if size is None or size > MAX_JSON_BYTES:
            raise StoreError(f"{repo_id}: its {name} is {size} bytes; at most {MAX_JSON_BYTES:,} are downloaded")
    with open(partial, "ab") as handle:
        if done < size:
            bounded = _Bounded(handle, size, f"{repo_id}: {name}")
            http_get(url, bounded, resume_size=done, headers=build_hf_headers(token=token), expected_size=size)
    if sha256 is not None:
        digest = hashlib.sha256()
        with open(partial, "rb") as handle:
            while block := handle.read(16 * 2**20):
                digest.update(block)
        if digest.hexdigest() != sha256:
            partial.unlink()
            raise StoreError(
                f"pulled files failed their checksums and were deleted: {name}'s SHA-256 differs from the manifest's"
            )
    os.replace(partial, final)


class _Bounded:
    """A file that refuses to grow beyond `limit` bytes: a server sending more than the manifest says is cut off."""

    def __init__(self, handle: Any, limit: int, what: str) -> None:
        self.handle, self.limit, self.what = handle, limit, what

    def write(self, data: bytes) -> int:
        if self.handle.tell() + len(data) > self.limit:  # the position, so a restart from byte 0 counts afresh
            raise StoreError(f"{self.what}: the server sent more bytes than the manifest records; not pulled")
        return self.handle.write(data)

    def __getattr__(self, name: str) -> Any:  # seek, tell, truncate, flush: the file's own
        return getattr(self.handle, name)


def pack_cache() -> Path:
    """Where `resolve_pack` pulls repositories: $OODBENCH_PACK_CACHE, else ~/.cache/oodbench/packs."""
    configured = os.environ.get("OODBENCH_PACK_CACHE")
    if configured:
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "oodbench" / "packs"


def resolve_pack(source: str, model_id: str, datasets: Sequence[str]) -> Path:
    """A pack folder for `source`: the folder itself, or a dataset repository ``owner/name`` whose entries of
    `model_id` and `datasets` (only those) are pulled into the pack cache, resuming what an earlier pull left."""
    import re

    from .pack import is_pack

    path = Path(source)
    if path.is_dir():
        if not is_pack(path):
            raise StoreError(f"--pack {source}: no manifest.json there (not a pack folder)")
        return path
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*", source) or ".." in source:
        raise StoreError(f"--pack {source}: neither a pack folder nor a dataset repository name (owner/name)")
    dest = pack_cache() / source
    pull_pack(source, dest, models=[model_id], datasets=list(dict.fromkeys(datasets)))
    return dest
