"""What the hostile-file tests share: run an operation that must not block, and fail (not hang) when it does."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

# Only a hang detector: a refused file ends the operation at once, so the wait is long enough for a loaded machine.
HANG_SECONDS = 60


def bounded(action: Callable[[], object], fifo: Path | None = None) -> BaseException | None:
    """Run `action` in a thread; the exception it raised (None when it returned).

    If it is still running after HANG_SECONDS, a reader blocked on `fifo` is released (opening the FIFO for writing
    lets a blocked open for reading return and read EOF) and the test fails: a regression fails rather than hangs.
    """
    outcome: list[BaseException | None] = []

    def target() -> None:
        try:
            action()
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(HANG_SECONDS)
    if thread.is_alive():
        if fifo is not None:
            with open(fifo, "wb"):
                pass
        thread.join(HANG_SECONDS)
        pytest.fail(f"the operation blocked on {fifo}")
    return outcome[0]
