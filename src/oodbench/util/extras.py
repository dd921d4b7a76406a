"""The command that installs an optional extra into the environment oodbench runs in (for missing-extra errors).

``pip install 'oodbench[web]'`` is wrong in two common cases: the ``pip`` on PATH belongs to another environment
than the running Python, and an editable install from a checkout would be replaced by a package index copy (or
fail where the package is not published). The hint names this interpreter and, for an editable install, its
source folder.
"""

from __future__ import annotations

import json
import shlex
import sys

__all__ = ["install_command", "missing_extra_message"]


def _editable_source() -> str | None:
    """The source folder of an editable install of oodbench, or None.

    Every distribution record named oodbench is read: a checkout's own ``src/oodbench.egg-info`` (left by the build)
    comes first on ``sys.path`` when ``src`` is, and holds no ``direct_url.json``; the installed record does.
    """
    from importlib import metadata
    from urllib.parse import unquote, urlparse

    for distribution in metadata.distributions(name="oodbench"):
        try:
            info = json.loads(distribution.read_text("direct_url.json") or "{}")
        except ValueError:
            continue
        url = info.get("url", "")
        if info.get("dir_info", {}).get("editable") and url.startswith("file://"):
            return unquote(urlparse(url).path)
    return None


def install_command(extra: str) -> str:
    """``<this python> -m pip install 'oodbench[extra]'`` (``-e '<checkout>[extra]'`` for an editable install)."""
    source = _editable_source()
    target = f"-e {shlex.quote(f'{source}[{extra}]')}" if source else shlex.quote(f"oodbench[{extra}]")
    return f"{shlex.quote(sys.executable)} -m pip install {target}"


def missing_extra_message(module: str | None, extra: str) -> str:
    """One line: which module is missing and the command that installs the extra here."""
    return f"{module or 'a module'} is not installed; install the {extra} extra into this environment: " + (
        install_command(extra)
    )
