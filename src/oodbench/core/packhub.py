"""Packs on the Hugging Face Hub: push a verified pack to a dataset repository, pull only the entries asked for.

Everything goes through ``huggingface_hub`` (the ``hub`` extra): its token from its usual place (``HF_TOKEN`` or
the file ``hf auth login`` writes; oodbench stores nothing) and its endpoint (``HF_ENDPOINT``, read at each call).
A pull fetches the manifest first (its size bounded before the download), pins the revision to the manifest's
commit, downloads only the files of the chosen models and datasets with ``hf_hub_download`` (which resumes a
broken download from the bytes already on disk), and checks every file's SHA-256 against the manifest before
the pack is used; a file that fails is deleted.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .errors import StoreError
from .pack import CARD, HEAD, MANIFEST, MAX_JSON_BYTES, Pack, PackSummary, _selection, verify_pack

__all__ = ["pull_pack", "push_pack"]


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

    An interrupted pull resumes: rerun it and each file continues from the bytes already downloaded. Every file
    is checked against the manifest's SHA-256 before the pull returns.
    """
    import time

    hub = _hub()
    started = time.perf_counter()
    dest = Path(dest)
    endpoint = _endpoint()
    common: dict[str, Any] = {"repo_type": "dataset", "token": token, "local_dir": dest, "endpoint": endpoint}
    try:
        url = hub.hf_hub_url(repo_id, MANIFEST, repo_type="dataset", revision=revision, endpoint=endpoint)
        info = hub.get_hf_file_metadata(url, token=token, endpoint=endpoint)
        if info.size is None or info.size > MAX_JSON_BYTES:
            raise StoreError(
                f"{repo_id}: its {MANIFEST} is {info.size} bytes; a pack manifest is at most {MAX_JSON_BYTES:,}"
            )
        pinned = info.commit_hash or revision
        hub.hf_hub_download(repo_id, MANIFEST, revision=pinned, **common)
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
        for name in [CARD, *names]:
            hub.hf_hub_download(repo_id, name, revision=pinned, **common)
    except Exception as exc:
        raise _hub_error("pull interrupted (rerun the same command to resume the download) from", repo_id, exc) from exc
    problems = pack.verify_files(names)
    if problems:
        for name in names:
            if any(f"/{name}:" in problem for problem in problems):
                (dest / name).unlink(missing_ok=True)
        raise StoreError(f"pulled files failed their checksums and were deleted: {problems[0]}")
    summary = PackSummary(entries=[f"{m}/{d}" for m, d in keys])
    summary.nbytes = sum(pack.files[name]["size"] for name in names)
    summary.seconds = time.perf_counter() - started
    return summary
