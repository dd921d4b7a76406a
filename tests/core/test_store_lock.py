"""Two writers of one store entry: an OS lock per entry, held from the writer's creation to the end of finalize.

Real processes throughout: a second writer fails naming the holder or waits for it; a SIGKILLed holder (and
a holder whose forked children live on) releases the lock; and 20 races of two writers with different data,
killed at random moments, never leave a complete entry that differs from one writer's input, nor a writer
that reports success over data other than its own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from oodbench import Outputs, Store
from oodbench.core.errors import StoreError

PROV = {"model": "m", "checkpoint": "abc", "preprocessing": {}}
ROWS, DIM, SHARD = 3000, 32, 150  # 20 shards: many steps at which a kill can land

SRC = str(Path(__file__).resolve().parents[2] / "src")

# A writer process: writes the data of seed `seed` to m/ds. `kill` is "" (run to the end), "shard:K" (SIGKILL
# itself after writing shard K) or "step:K" (SIGKILL itself at the K-th durable step of finalize). "hold" keeps
# the lock open (printing "locked") until stdin closes; "fork" also leaves a forked child sleeping.
WRITER = textwrap.dedent(
    """
    import os, signal, sys, time
    import numpy as np
    from oodbench import Outputs, Store
    from oodbench import store as store_module

    root, seed, kill, wait = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    ROWS, DIM, SHARD = {rows}, {dim}, {shard}
    PROV = {{"model": "m", "checkpoint": "abc", "preprocessing": {{}}}}

    def outputs(seed):
        rng = np.random.default_rng(seed)
        return Outputs(rng.normal(size=(ROWS, DIM)).astype(np.float32), labels=rng.integers(0, 5, ROWS))

    if kill in ("hold", "fork"):
        writer = Store(root).writer("m", "ds", provenance=PROV, num_items=ROWS, shard_size=SHARD)
        if kill == "fork":
            if os.fork() == 0:
                # Said by the child itself: fork's hooks (which drop the inherited lock) have run by now.
                os.write(1, f"child {{os.getpid()}}\\n".encode())  # one write: lines of two processes never mix
                time.sleep(60)
                os._exit(0)
        os.write(1, b"locked\\n")
        sys.stdin.read()
        sys.exit(0)
    if kill.startswith("shard:"):
        at, original = int(kill[6:]), store_module.EntryWriter.write_shard

        def write_shard(self, shard, arrays, **kw):
            original(self, shard, arrays, **kw)
            if shard == at:
                os.kill(os.getpid(), signal.SIGKILL)

        store_module.EntryWriter.write_shard = write_shard
    if kill.startswith("step:"):
        steps = [0]

        def step(name):
            steps[0] += 1
            if steps[0] == int(kill[5:]):
                os.kill(os.getpid(), signal.SIGKILL)

        store_module._merge_step = step
    Store(root).write_outputs(
        "m", "ds", outputs(seed), provenance=PROV, shard_size=SHARD, wait=None if wait == "forever" else float(wait)
    )
    print("wrote", seed, flush=True)
    """
).format(rows=ROWS, dim=DIM, shard=SHARD)


def _outputs(seed: int) -> Outputs:
    rng = np.random.default_rng(seed)
    return Outputs(rng.normal(size=(ROWS, DIM)).astype(np.float32), labels=rng.integers(0, 5, ROWS))


def _start(script: Path, root: Path, seed: int, kill: str = "", wait: str = "forever") -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen(
        [sys.executable, str(script), str(root), str(seed), kill, wait],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "writer.py"
    path.write_text(WRITER)
    return path


def _equals(store: Store, seed: int) -> bool:
    """Whether the complete entry holds exactly the data writer `seed` was given (and verifies)."""
    back, expected = store.read("m", "ds"), _outputs(seed)
    same = back.features.tobytes() == expected.features.tobytes() and np.array_equal(back.labels, expected.labels)
    same = same and np.array_equal(store.read_array("m", "ds", "index"), np.arange(ROWS))
    return same and store.verify("m", "ds").ok


def _holding(script: Path, root: Path, mode: str = "hold") -> tuple[subprocess.Popen[str], int | None]:
    """A process that holds the entry's lock (and the pid of its forked child with mode "fork")."""
    proc = _start(script, root, 0, mode)
    lines = [proc.stdout.readline().strip() for _ in range(2 if mode == "fork" else 1)]
    if "locked" not in lines:
        proc.kill()
        pytest.fail(f"the holder did not start: {lines} {proc.communicate()[1]}")
    child = next((int(line.split()[1]) for line in lines if line.startswith("child ")), None)
    return proc, child


def test_second_writer_fails_with_one_line_naming_the_holder(script, tmp_path):
    root = tmp_path / "store"
    holder, _ = _holding(script, root)
    try:
        with pytest.raises(StoreError) as info:
            Store(root).writer("m", "ds", provenance=PROV, num_items=ROWS, shard_size=SHARD)
        message = str(info.value)
        assert "\n" not in message
        assert f"store entry m/ds is being written by pid {holder.pid} on " in message
        assert "writer.py" in message  # the holder's command line
        # Deleting or overwriting the entry is refused in the same way, and the holder's data stays.
        with pytest.raises(StoreError, match=f"pid {holder.pid}"):
            Store(root).delete("m", "ds")
        with pytest.raises(StoreError, match=f"pid {holder.pid}"):
            Store(root).write_outputs("m", "ds", _outputs(1), provenance=PROV, shard_size=SHARD, overwrite=True)
        assert (root / "m" / "ds" / "meta.json").is_file()
        # While it is held, `store ls` says it is being written now (the description a reader gets too).
        assert f"being written now by pid {holder.pid}" in Store(root).describe_incomplete("m", "ds")
    finally:
        holder.stdin.close()
        holder.wait()
    # Released on a clean exit: the next writer gets the lock at once.
    Store(root).writer("m", "ds", provenance=PROV, num_items=ROWS, shard_size=SHARD).close()


def test_sigkilled_holder_releases_the_lock_and_its_forked_children_do_not_keep_it(script, tmp_path):
    root = tmp_path / "store"
    holder, child = _holding(script, root, "fork")
    assert child is not None
    try:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        os.kill(child, 0)  # the forked child (a data-loader worker, say) still runs ...
        writer = Store(root).writer("m", "ds", provenance=PROV, num_items=ROWS, shard_size=SHARD)  # ... yet no wait
        writer.close()
        # The killed holder left its record behind; it is not described as a live writer.
        assert "being written now" not in Store(root).describe_incomplete("m", "ds")
    finally:
        os.kill(child, signal.SIGKILL)


def test_a_waiting_writer_starts_only_after_the_holder_is_gone(script, tmp_path):
    root = tmp_path / "store"
    holder, _ = _holding(script, root)
    try:
        with pytest.raises(StoreError, match=r"waited 0\.3 s"):
            Store(root).writer("m", "ds", provenance=PROV, num_items=ROWS, shard_size=SHARD, wait=0.3)
    finally:
        holder.stdin.close()  # the holder exits once its stdin closes; the waiting writer below follows it
    writer = Store(root).writer("m", "ds", provenance=PROV, num_items=ROWS, shard_size=SHARD, wait=None)
    assert holder.poll() is not None  # it got the lock only once the holder had exited
    writer.close()


def test_in_one_process_the_newest_writer_supersedes_the_older(tmp_path):
    store = Store(tmp_path)
    data = _outputs(0)
    old = store.writer("m", "ds", provenance=PROV, num_items=ROWS, shard_size=SHARD)
    old.write_shard(0, {"features": data.features[:SHARD]})
    new = store.writer("m", "ds", provenance=PROV, num_items=ROWS, shard_size=SHARD)
    with pytest.raises(StoreError, match="superseded by a newer writer"):
        old.write_shard(1, {"features": data.features[SHARD : 2 * SHARD]})
    old.close()  # a superseded writer's close leaves the newer one's lock alone
    assert new.pending_shards()[0] == 1
    for shard in new.pending_shards():
        new.write_shard(shard, {"features": data.features[new.shard_rows(shard)]})
    new.finalize()
    with pytest.raises(StoreError, match="closed"):
        new.write_shard(0, {"features": data.features[:SHARD]})
    assert store.read("m", "ds").features.tobytes() == data.features.tobytes()


def test_rewriting_with_other_data_is_refused_not_reported_as_success(tmp_path):
    store = Store(tmp_path)
    store.write_outputs("m", "ds", _outputs(0), provenance=PROV, shard_size=SHARD)
    store.write_outputs("m", "ds", _outputs(0), provenance=PROV, shard_size=SHARD)  # the same data: nothing to do
    with pytest.raises(StoreError, match="started from other data"):
        store.write_outputs("m", "ds", _outputs(1), provenance=PROV, shard_size=SHARD)
    assert _equals(store, 0)
    store.write_outputs("m", "ds", _outputs(1), provenance=PROV, shard_size=SHARD, overwrite=True)
    assert _equals(store, 1)


@pytest.mark.slow
def test_twenty_races_with_random_kills_leave_only_one_writers_data(script, tmp_path):
    """Two writers of different data start together; kills land at random shards, finalize steps and times."""
    rng = np.random.default_rng(2026)
    # The durable steps of one finalize: planned, 3 arrays x 20 shards x (copied, recorded, released) + renamed
    # each, merged, completed.
    merge_steps = 3 + 3 * (3 * (ROWS // SHARD) + 1)
    outcomes = []
    for race in range(20):
        root = tmp_path / f"race{race}"
        plans = []
        for _ in range(2):
            kind = rng.choice(["none", "shard", "step", "timer"])
            if kind == "shard":
                plans.append((f"shard:{rng.integers(0, ROWS // SHARD)}", None))
            elif kind == "step":
                plans.append((f"step:{rng.integers(1, merge_steps + 1)}", None))
            elif kind == "timer":
                plans.append(("", float(rng.uniform(0.0, 3.0))))
            else:
                plans.append(("", None))
        started = time.monotonic()
        procs = [_start(script, root, seed, kill) for seed, (kill, _) in enumerate(plans)]
        timers = {seed: at for seed, (_, at) in enumerate(plans) if at is not None}
        while any(p.poll() is None for p in procs):
            for seed, at in list(timers.items()):
                if time.monotonic() - started >= at:
                    procs[seed].send_signal(signal.SIGKILL)
                    del timers[seed]
            time.sleep(0.005)
        results = [(p.returncode, p.communicate()) for p in procs]
        store = Store(root)
        complete = store.exists("m", "ds")
        for seed, (code, (out, err)) in enumerate(results):
            if code == 0:  # a writer that reports success wrote its own data
                assert complete and _equals(store, seed), (race, plans, out, err)
            elif code > 0:  # it failed in one line: another writer's entry, never a mix
                assert "started from other data" in err or "being written" in err, (race, plans, err)
        if complete:
            assert _equals(store, 0) or _equals(store, 1), (race, plans)
        # Whatever a kill left, one of the writers finishes it, with exactly its own data.
        finished = None
        for seed in (0, 1):
            try:
                store.write_outputs("m", "ds", _outputs(seed), provenance=PROV, shard_size=SHARD)
            except StoreError as exc:
                assert "started from other data" in str(exc)
                continue
            finished = seed
            break
        assert finished is not None and _equals(store, finished), (race, plans)
        outcomes.append((plans, [code for code, _ in results], complete))
    # Kills happened: some writers died (SIGKILL: -9), and some races left no complete entry behind them.
    assert any(-signal.SIGKILL in codes for _, codes, _ in outcomes)


def test_a_lock_that_cannot_be_taken_is_one_line():
    with pytest.raises(StoreError, match=r"cannot write store entry m/ds: cannot open its lock file /proc/"):
        Store("/proc/oodbench-no-such-store").writer("m", "ds", provenance=PROV, num_items=4, shard_size=2)


def test_an_abandoned_writer_in_a_reference_cycle_is_released_by_the_collector(tmp_path, script):
    import gc

    writer = Store(tmp_path).writer("m", "ds", provenance=PROV, num_items=ROWS, shard_size=SHARD)
    cycle: list[object] = [writer]
    cycle.append(cycle)
    del writer, cycle
    gc.collect()
    # Another process can now open the entry at once (the lock went with the writer).
    holder, _ = _holding(script, tmp_path)
    holder.stdin.close()
    assert holder.wait() == 0
