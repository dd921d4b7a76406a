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
    """The source folder of an editable install of oodbench, or None."""
    from importlib import metadata
    from urllib.parse import unquote, urlparse

    try:
        text = metadata.distribution("oodbench").read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return None
    try:
        info = json.loads(text or "{}")
    except ValueError:
        return None
    url = info.get("url", "")
    if not info.get("dir_info", {}).get("editable") or not url.startswith("file://"):
        return None
    return unquote(urlparse(url).path)


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
