"""Login throttling (per client and name, per client, per account, per recognised browser; a fake clock),
device tokens and the client address behind trusted proxies."""

from __future__ import annotations

import pytest

pytest.importorskip("argon2", reason="the annotation app needs the 'web' extra")
from oodbench.annotate.security import (  # noqa: E402
    DeviceTokens,
    LoginThrottle,
    client_address,
    parse_trusted_proxies,
)
from oodbench.core.errors import AnnotateError  # noqa: E402


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


def test_many_addresses_share_one_budget_per_account():
    throttle = LoginThrottle(per_name=5, per_client=20, per_account=10, window_s=60, clock=Clock())
    for i in range(10):  # ten addresses, one guess each: no per-client limit is reached
        assert not throttle.blocked(f"198.51.100.{i}", "alice")
        throttle.failed(f"198.51.100.{i}", "alice", known_account=True)
    assert throttle.blocked("198.51.100.99", "alice")  # the eleventh address waits: the account's budget is spent
    assert not throttle.blocked("198.51.100.99", "bob")  # other accounts are untouched


def test_a_recognised_browser_is_never_locked_out_by_others():
    clock = Clock()
    throttle = LoginThrottle(per_name=3, per_client=5, per_account=4, window_s=60, clock=clock)
    for i in range(50):  # a stranger from many addresses and from the owner's own address
        throttle.failed(f"203.0.113.{i}", "alice", known_account=True)
        throttle.failed("192.0.2.1", "alice", known_account=True)
    assert throttle.blocked("192.0.2.1", "alice")  # a browser without a token waits
    assert not throttle.blocked("192.0.2.1", "alice", device="owner-laptop")  # the owner's browser does not
    for _ in range(3):  # its own failures count, for itself only
        throttle.failed("192.0.2.1", "alice", device="owner-laptop")
    assert throttle.blocked("192.0.2.1", "alice", device="owner-laptop")
    assert not throttle.blocked("192.0.2.1", "alice", device="owner-desktop")
    throttle.succeeded("192.0.2.1", "alice", device="owner-desktop")
    clock.now += 61
    assert not throttle.blocked("192.0.2.1", "alice") and not throttle.blocked("x", "alice", device="owner-laptop")


def test_invented_names_are_counted_like_real_ones_but_cannot_evict_a_real_account():
    throttle = LoginThrottle(per_name=100, per_client=100, per_account=3, window_s=60, max_keys=50, clock=Clock())
    for i in range(3):
        throttle.failed(f"10.0.0.{i}", "ghost")  # not an account: blocked the same way, so nothing tells them apart
        throttle.failed(f"10.0.1.{i}", "alice", known_account=True)
    assert throttle.blocked("10.9.9.9", "ghost") and throttle.blocked("10.9.9.9", "alice")
    for i in range(5000):  # a flood of new addresses and names evicts the bounded table...
        throttle.failed(f"10.{i // 65536}.{i // 256 % 256}.{i % 256}", f"name{i}")
        assert len(throttle._failures) <= 50
    assert not throttle.blocked("10.9.9.9", "ghost")  # ...and with it the invented name's count,
    assert throttle.blocked("10.9.9.9", "alice")  # but never a real account's


def test_device_tokens_cannot_be_forged_moved_or_kept_forever():
    tokens = DeviceTokens("project secret", max_age_s=3600)
    cookie = tokens.issue("alice")
    device = tokens.device_for(cookie, "alice")
    assert device and tokens.device_for(tokens.issue("alice", device), "alice") == device
    assert tokens.device_for(cookie, "bob") is None  # bound to its account
    assert DeviceTokens("another project's secret").device_for(cookie, "alice") is None
    assert tokens.device_for(cookie[:-2] + ("A" if cookie[-2] != "A" else "B") + cookie[-1], "alice") is None
    assert tokens.device_for(None, "alice") is None and tokens.device_for("garbage", "alice") is None
    expired = DeviceTokens("project secret", max_age_s=-1)  # any token is older than a negative age
    assert expired.device_for(cookie, "alice") is None


def test_client_address_ignores_forwarding_headers_unless_the_peer_is_a_trusted_proxy():
    spoofed = ["203.0.113.77", "198.51.100.1, 10.0.0.9"]
    assert client_address("127.0.0.1", spoofed, ()) == "127.0.0.1"  # the default: headers never read
    proxy = parse_trusted_proxies(["127.0.0.1"])
    assert client_address("192.0.2.5", spoofed, proxy) == "192.0.2.5"  # not from the proxy: headers ignored
    # From the proxy: the hop it appended (the rightmost), not what the client wrote before it.
    assert client_address("127.0.0.1", ["203.0.113.77, 192.0.2.5"], proxy) == "192.0.2.5"
    assert client_address("127.0.0.1", ["203.0.113.77", "192.0.2.5:51000"], proxy) == "192.0.2.5"
    chain = parse_trusted_proxies(["127.0.0.1", "10.0.0.0/8"])  # two proxies in a row: skip both
    assert client_address("127.0.0.1", ["203.0.113.77, 192.0.2.5, 10.1.2.3"], chain) == "192.0.2.5"
    assert client_address("127.0.0.1", ["[2001:db8::1]:443"], proxy) == "2001:db8::1"
    assert client_address("127.0.0.1", [], proxy) == "127.0.0.1"  # the proxy sent no header
    assert client_address(None, spoofed, proxy) == "unknown"


@pytest.mark.parametrize("value", ["*", "localhost", "10.0.0.0/33", ""])
def test_a_trusted_proxy_must_be_an_address_or_network(value):
    with pytest.raises(AnnotateError, match="--trusted-proxy .* is not an IP address or network"):
        parse_trusted_proxies([value])
