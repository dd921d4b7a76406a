"""Hub weights before a model is created: from the cache without a network request, or fail at once.

huggingface_hub retries an unreachable hub for about a minute (five retries per file, two files for timm) before
giving up. Here weights in the local cache load with the hub switched to offline mode for the call, and weights
that are not cached are fetched only when the hub answers a 3-second connection; otherwise one line names
HF_HUB_OFFLINE and the cache path.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator, Sequence
from pathlib import Path
from urllib.parse import urlparse

from ..core.errors import ExtractError

__all__ = ["CONNECT_TIMEOUT_S", "cached_file", "hf_cache_dir", "offline", "prefer_cache", "require_reachable"]

CONNECT_TIMEOUT_S = 3.0


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache ($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def offline() -> bool:
    """True when HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set."""
    from huggingface_hub import constants

    return bool(constants.is_offline_mode())


def cached_file(
    repo_id: str | None,
    filenames: Sequence[str] = (),
    url: str | None = None,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    url_dir: str | os.PathLike[str] | None = None,
) -> Path | None:
    """The first of `filenames` of hub repo `repo_id` in the Hugging Face cache (or `cache_dir`), or the file of `url`
    in `url_dir` (default: torch's hub checkpoints); None when none is there."""
    if repo_id:
        from huggingface_hub import try_to_load_from_cache

        for filename in filenames:
            found = try_to_load_from_cache(repo_id, filename, cache_dir=cache_dir)
            if isinstance(found, str) and os.path.isfile(found):
                return Path(found)
    if url:
        if url_dir is None:
            import torch.hub

            url_dir = Path(torch.hub.get_dir()) / "checkpoints"
        candidate = Path(url_dir) / os.path.basename(urlparse(url).path)
        if candidate.is_file():
            return candidate
    return None


def _host(url: str | None) -> tuple[str, int]:
    from huggingface_hub import constants

    parsed = urlparse(url or constants.ENDPOINT)
    return parsed.hostname or "huggingface.co", parsed.port or (80 if parsed.scheme == "http" else 443)


def require_reachable(
    what: str, *, url: str | None = None, cache: str | os.PathLike[str] | None = None, fix: str = ""
) -> None:
    """Raise one ExtractError at once when `what` (weights not in `cache`, default the Hugging Face cache) cannot be
    downloaded: offline mode, or the host of `url` (default: the hub) does not connect within CONNECT_TIMEOUT_S."""
    cache = Path(cache) if cache is not None else hf_cache_dir()
    tail = f"; {fix}" if fix else ""
    if offline():
        raise ExtractError(
            f"{what} are not in the cache ({cache}) and HF_HUB_OFFLINE=1 forbids downloading them: unset "
            f"HF_HUB_OFFLINE where the hub is reachable, or point HF_HOME at a cache that holds them{tail}"
        )
    host, port = _host(url)
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
            return
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
    raise ExtractError(
        f"{what} are not in the cache ({cache}) and {host} cannot be reached ({reason}); with the weights cached "
        f"elsewhere, point HF_HOME there and set HF_HUB_OFFLINE=1 to load them without network requests{tail}"
    )


@contextlib.contextmanager
def prefer_cache(cached: bool) -> Iterator[None]:
    """While loading weights found in the cache, keep huggingface_hub from asking the hub about newer ones."""
    if not cached:
        yield
        return
    from huggingface_hub import constants

    previous = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = previous
