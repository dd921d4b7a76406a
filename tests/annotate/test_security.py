"""Login throttling: per (client, name) and per client, bounded memory, windows (a fake clock)."""

from __future__ import annotations

import pytest

pytest.importorskip("argon2", reason="the annotation app needs the 'web' extra")
from oodbench.annotate.security import LoginThrottle  # noqa: E402


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def fail(throttle: LoginThrottle, client: str, name: str, times: int) -> None:
    for _ in range(times):
        throttle.failed(client, name)


def test_failures_on_one_name_block_that_client_only():
    throttle = LoginThrottle(per_name=3, per_client=10, window_s=60, clock=Clock())
    fail(throttle, "attacker", "alice", 2)
    assert not throttle.blocked("attacker", "alice")
    fail(throttle, "attacker", "alice", 1)
    assert throttle.blocked("attacker", "alice")
    assert not throttle.blocked("attacker", "bob")  # other names: the per-client budget is not spent
    assert not throttle.blocked("alice-laptop", "alice")  # nobody else is locked out


def test_per_client_budget_spans_names():
    throttle = LoginThrottle(per_name=3, per_client=5, window_s=60, clock=Clock())
    for i in range(5):
        assert not throttle.blocked("sprayer", f"user{i}")
        throttle.failed("sprayer", f"user{i}")
    assert throttle.blocked("sprayer", "fresh-name") and not throttle.blocked("elsewhere", "fresh-name")


def test_window_expires_and_success_forgets_only_the_name():
    clock = Clock()
    throttle = LoginThrottle(per_name=2, per_client=3, window_s=60, clock=clock)
    fail(throttle, "c", "alice", 2)
    assert throttle.blocked("c", "alice")
    clock.now += 60.0  # the oldest failure leaves the window exactly at window_s
    assert not throttle.blocked("c", "alice")
    fail(throttle, "c", "alice", 1)
    throttle.succeeded("c", "alice")
    assert not throttle.blocked("c", "alice")
    assert not throttle.blocked("c", "carol")  # 1 failure in the window (2 left it)
    fail(throttle, "c", "bob", 2)
    # The client's failures still count after a success: its own account cannot reset its budget.
    assert throttle.blocked("c", "carol")


def test_memory_is_bounded_whatever_the_traffic():
    throttle = LoginThrottle(per_name=3, per_client=4, window_s=60, max_keys=100, clock=Clock())
    for i in range(5000):
        throttle.failed(f"10.0.{i // 256}.{i % 256}", f"name{i}")
        assert len(throttle) <= 100
    throttle.failed("last", "x")
    assert all(len(times) <= 4 for times in throttle._failures.values())
    assert ("client", "last") in throttle._failures  # the most recent failures are the ones kept
