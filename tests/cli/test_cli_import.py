"""`import oodbench.cli` (what `oodbench --help` pays for) loads none of the heavy libraries; an import check, not a timing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "scipy", "sklearn", "faiss", "pyarrow", "timm", "open_clip", "matplotlib")


def _loaded_after(code: str) -> list[str]:
    probe = f"import sys; {code}; print(__import__('json').dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "code",
    [
        "import oodbench.cli",
        "import oodbench",
        "import oodbench.analysis, oodbench.audit, oodbench.zeroshot, oodbench.runner, oodbench.annotate",
        "import oodbench.report, oodbench.extract, oodbench.detectors",
        "import oodbench.core, oodbench.util, oodbench.text, oodbench.evaluation",
    ],
)
def test_cli_and_packages_import_no_heavy_library(code: str) -> None:
    assert _loaded_after(code) == []


def test_lazy_exports_still_resolve() -> None:
    import oodbench
    import oodbench.audit
    import oodbench.audit.fingerprint  # binds the submodule name: the export must still win

    assert (
        callable(oodbench.audit.fingerprint) and oodbench.audit.fingerprint.__module__ == "oodbench.audit.fingerprint"
    )
    assert oodbench.metrics.__name__ == "oodbench.core.metrics" and oodbench.Store.__name__ == "Store"
    for package in ("analysis", "audit", "zeroshot", "runner", "annotate", "report", "evaluation"):
        module = __import__(f"oodbench.{package}", fromlist=["*"])
        for name in module.__all__:
            assert getattr(module, name) is not None, f"oodbench.{package}.{name}"
