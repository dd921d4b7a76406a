"""Progress in a log file as whole plain lines; Ctrl-C as one line naming what finished, what is kept, how to resume."""

from __future__ import annotations

import math

import numpy as np
import pytest

from oodbench.cli.main import main
from oodbench.util import progress


def test_progress_in_a_log_file_is_plain_whole_lines(capsys, monkeypatch):
    monkeypatch.setattr(progress, "PLAIN_EVERY_S", math.inf)  # lines by tenths only, however slow the machine
    bar = progress.make_progress(rate_unit="img")  # stderr is captured here: not a terminal
    assert isinstance(bar, progress.PlainProgress)
    long_name = "tf_efficientnet_lite0@579344248a93/imagenet-1k-train-subset-of-a-long-name"
    with bar:
        task = bar.add_task(long_name, total=84)
        for _ in range(84):
            bar.advance(task, 1)
    lines = capsys.readouterr().err.splitlines()
    # One line per tenth reached (84 steps of 1/84 cross each of the ten tenths once) — the last is the end.
    assert len(lines) == 10
    assert all(line.startswith(f"{long_name}: ") for line in lines)  # never cut to 80 columns
    assert lines[0].startswith(f"{long_name}: 9/84 (11%)")
    assert lines[-1].startswith(f"{long_name}: 84/84 (100%)") and "elapsed" in lines[-1] and "left" not in lines[-1]
    assert "\x1b" not in "".join(lines) and "━" not in "".join(lines)


def test_disabled_progress_writes_nothing(capsys):
    with progress.make_progress(False) as bar:
        task = bar.add_task("quiet", total=3)
        bar.advance(task, 3)
    assert capsys.readouterr().err == ""


def test_a_transient_task_reports_only_after_a_silence_and_not_its_end(capsys, monkeypatch):
    monkeypatch.setattr(progress, "PLAIN_EVERY_S", math.inf)  # a silence only where the test makes one
    with progress.PlainProgress(transient=True) as bar:
        task = bar.add_task("fit chunks", total=10)
        bar.advance(task, 5)
        monkeypatch.setattr(progress, "PLAIN_EVERY_S", 0.0)
        bar.advance(task, 1)
        monkeypatch.setattr(progress, "PLAIN_EVERY_S", math.inf)
        bar.advance(task, 4)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("fit chunks: 6/10 (60%)")


def test_interrupted_line_names_finished_kept_lost_and_the_command():
    progress.forget_work()
    assert progress.interrupted_line("oodbench x") == (
        "interrupted: nothing finished; nothing kept; to start again, run: oodbench x"
    )
    progress.note_work("detectors", finished="detectors msp", kept="their scores in runs/a")
    progress.note_work("detectors", finished="detectors msp, energy")
    progress.note_work("tmp", lost="the extracted features with the temporary store (keep them with --store)")
    assert progress.interrupted_line("oodbench evaluate --out runs/a") == (
        "interrupted: finished detectors msp, energy; kept their scores in runs/a; lost the extracted features "
        "with the temporary store (keep them with --store); to resume, run: oodbench evaluate --out runs/a"
    )
    progress.forget_work()


def test_ctrl_c_during_evaluate_prints_one_line_and_exits_130(tmp_path, monkeypatch, capsys):
    """A real run with Ctrl-C after its first detector: one line, the first detector's scores kept, status 130."""
    from oodbench import Outputs, Store
    from oodbench.detectors import get_class

    rng = np.random.default_rng(0)
    store = Store(tmp_path / "store")
    provenance = {"model": "toy", "checkpoint": "c", "preprocessing": {}}
    for name in ("fit", "id", "ood"):
        z = rng.normal(size=(50, 4)).astype(np.float32)
        store.write_outputs(
            "toy", name, Outputs(z, z @ rng.normal(size=(4, 3)).astype(np.float32)), provenance=provenance
        )

    def interrupt(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(get_class("energy"), "fit", interrupt)
    out = tmp_path / "run"
    args = ["evaluate", "--store", str(store.root), "--model", "toy", "--fit", "fit", "--id", "id", "--ood", "ood"]
    args += ["-d", "msp,energy", "--out", str(out), "--no-progress"]
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    err = capsys.readouterr().err
    assert exit_info.value.code == 130
    (line,) = err.strip().splitlines()
    assert line == (
        f"interrupted: finished detectors msp; kept their scores in {out}; to resume, run: oodbench " + " ".join(args)
    )
    from oodbench.core.scores import load_scores

    assert set(load_scores(out, "toy", "ood")) == {"msp"}
