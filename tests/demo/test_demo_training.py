"""The demo's training: progress per epoch, and a thread count pinned for training and restored afterwards."""

from __future__ import annotations

import io

import numpy as np
import torch
from rich.console import Console

import oodbench.demo.model as demo_model
import oodbench.util.progress as progress_module
from oodbench.demo import TRAIN_THREADS, prepare
from oodbench.demo.data import digits_splits


def test_on_epoch_reports_every_epoch_with_its_mean_loss():
    split = digits_splits(seed=0)["digits-fit"]
    seen: list[tuple[int, float]] = []
    demo_model.train_cnn(
        split.images[:128], split.labels[:128], 6, epochs=3, seed=0, on_epoch=lambda e, loss: seen.append((e, loss))
    )
    assert [epoch for epoch, _ in seen] == [1, 2, 3]
    assert all(np.isfinite(loss) and loss > 0 for _, loss in seen)
    assert seen[0][1] < np.log(6) * 1.5  # cross-entropy of 6 classes starts near log 6, not at an arbitrary scale


def test_prepare_shows_epochs_pins_threads_and_restores_them(tmp_path, monkeypatch):
    during: list[int] = []
    train = demo_model.train_cnn

    def recording_train(*args, **kwargs):
        during.append(torch.get_num_threads())
        return train(*args, **kwargs)

    monkeypatch.setattr(demo_model, "train_cnn", recording_train)
    screen = io.StringIO()
    # A terminal, so the progress is a live bar (a log file would get plain lines).
    monkeypatch.setattr(progress_module, "console", Console(file=screen, force_terminal=True, width=120))
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        setup = prepare(tmp_path, seed=0, epochs=2, verbose=True)
        assert during == [TRAIN_THREADS]
        assert torch.get_num_threads() == 1  # the caller's setting survives the demo
    finally:
        torch.set_num_threads(before)
    assert "epoch loss" in screen.getvalue() and "2/2" in screen.getvalue()
    assert setup.info["train_threads"] == TRAIN_THREADS and setup.info["torch"] == torch.__version__
