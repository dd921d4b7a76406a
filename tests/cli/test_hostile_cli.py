"""Bad input on the command line or in a named file: one line naming the problem and exit status 2, never exit 1."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import pytest

from oodbench.cli.main import main

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
    }
    files["binary"].write_bytes(bytes(range(256)) * 8)
    files["nul"].write_bytes(b"dog\x00cat\n")
    files["latin1"].write_bytes("caf\xe9\n".encode("latin-1"))
    files["badgz"].write_bytes(b"\x1f\x8b\x08\x00garbage")
    files["gzbinary"].write_bytes(gzip.compress(bytes(range(256))))
    os.mkfifo(files["fifo"])
    return files


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
    argv = [arg.format(tmp=tmp_path, **files) for arg in CASES[case]]
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert info.value.code == 2, err
    assert "Traceback" not in err and "unexpected" not in err, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
