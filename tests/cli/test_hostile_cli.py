"""Bad input on the command line or in a named file: one line naming the problem and exit status 2, never exit 1."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import pytest

from ..cli_once import main

pytestmark = pytest.mark.hostile

ROOT = Path(__file__).resolve().parents[2]


def _files(tmp: Path) -> dict[str, Path]:
    files = {
        "binary": tmp / "random.bin",
        "nul": tmp / "nul.txt",
        "latin1": tmp / "latin1.txt",
        "badgz": tmp / "broken.txt.gz",
        "gzbinary": tmp / "binary.txt.gz",
        "fifo": tmp / "pipe.txt",
        "hugeseed": tmp / "huge-seed.toml",
        "negativeseed": tmp / "negative-seed.toml",
    }
    files["binary"].write_bytes(bytes(range(256)) * 8)
    files["nul"].write_bytes(b"dog\x00cat\n")
    files["latin1"].write_bytes("caf\xe9\n".encode("latin-1"))
    files["badgz"].write_bytes(b"\x1f\x8b\x08\x00garbage")
    files["gzbinary"].write_bytes(gzip.compress(bytes(range(256))))
    os.mkfifo(files["fifo"])
    demo = (ROOT / "configs" / "demo.toml").read_text()
    assert "\nseed = 0\n" in demo
    files["hugeseed"].write_text(demo.replace("\nseed = 0\n", f"\nseed = {10**30}\n"))
    files["negativeseed"].write_text(demo.replace("\nseed = 0\n", "\nseed = -1\n"))
    return files


def _run_set(assignment: str) -> list[str]:
    return ["run", str(ROOT / "configs" / "demo.toml"), "--set", assignment]


CASES = {
    **{
        f"vocab import {kind}": ["zeroshot", "vocab", "import", f"{{{kind}}}", "--name", "x"]
        for kind in ("binary", "nul", "latin1", "badgz", "gzbinary", "fifo")
    },
    **{
        f"audit scan {kind}": ["audit", "scan", "--label-space", f"{{{kind}}}"]
        for kind in ("binary", "nul", "latin1", "fifo")
    },
    "audit overlap --max-rows -1": [
        "audit",
        "overlap",
        "--store",
        "{tmp}",
        "--model",
        "m",
        "--id",
        "a",
        "--ood",
        "b",
        "--max-rows",
        "-1",
    ],
    "audit overlap --max-rows 0": [
        "audit",
        "overlap",
        "--store",
        "{tmp}",
        "--model",
        "m",
        "--id",
        "a",
        "--ood",
        "b",
        "--max-rows",
        "0",
    ],
    "audit overlap -k 0": [
        "audit",
        "overlap",
        "--store",
        "{tmp}",
        "--model",
        "m",
        "--id",
        "a",
        "--ood",
        "b",
        "-k",
        "0",
    ],
    "audit battery --seed -1": ["audit", "battery", "--synthetic", "--seed", "-1"],
    "audit battery --seed 2**40": ["audit", "battery", "--synthetic", "--seed", str(2**40)],
    "extract --seed 2**31": ["extract", "--seed", str(2**31)],
    "probe --seed -1": ["probe", "--seed", "-1"],
    "vocab build siblings --seed 10**20": ["zeroshot", "vocab", "build", "siblings", "--seed", str(10**20)],
    "audit battery --folds 1": ["audit", "battery", "--synthetic", "--folds", "1"],
    "run --set seed of 5000 digits": [
        "run",
        str(ROOT / "configs" / "demo.toml"),
        "--set",
        "experiment.seed=" + "7" * 5000,
    ],
    "run --set seed of 4301 digits": [
        "run",
        str(ROOT / "configs" / "demo.toml"),
        "--set",
        "experiment.seed=" + "9" * 4301,
    ],
    # Seeds beyond 0 .. 2^31 - 1 that Python parses: refused when the experiment is read, before any work (they
    # used to reach scikit-learn inside the demo model's training: an unexpected error, exit status 1).
    "run --set seed 2**31": _run_set(f"experiment.seed={2**31}"),
    "run --set seed 10**30": _run_set(f"experiment.seed={10**30}"),
    "run --set seed -1": _run_set("experiment.seed=-1"),
    "run --set seed of 4000 digits": _run_set("experiment.seed=" + "9" * 4000),
    "run --set analysis.intervals.seed 2**63": _run_set(f"analysis.intervals.seed={2**63}"),
    "run --set analysis.subsample.seed 2**64": _run_set(f"analysis.subsample.seed={2**64}"),
    "run --set models[0].seed 10**30": _run_set(f"models.0.seed={10**30}"),
    "run with seed 10**30 in the file": ["run", "{hugeseed}"],
    "run with seed -1 in the file": ["run", "{negativeseed}"],
    **{
        f"probe --device {device}": [
            "probe",
            "--store",
            "{tmp}",
            "--model-id",
            "m",
            "--fit-dataset",
            "f",
            "--device",
            device,
        ]
        for device in ("cuda:7", "cuda:99", "bogus", "cuda:-1", "")
    },
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch, case):
    monkeypatch.chdir(tmp_path)  # nothing may be written, least of all into the working directory
    files = _files(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    argv = [arg.format(tmp=tmp_path, **files) for arg in CASES[case]]
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert info.value.code == 2, err
    assert "Traceback" not in err and "unexpected" not in err, err
    assert len(lines) == 1 and lines[0].startswith("error: ") and len(lines[0]) <= 500, err
    assert sorted(tmp_path.rglob("*")) == before  # refused before any work
    if "seed" in case:
        assert "seed" in lines[0], err  # refused for the seed, not for some other argument
