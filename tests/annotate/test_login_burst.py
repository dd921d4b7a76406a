"""Parallel bursts of wrong passwords at a real `oodbench annotate serve` process (loopback only).

The throttle's promise (5 password checks per address and name, 10 per account, per window) must hold however
many attempts arrive at once: each attempt is counted before its password is checked. The number of password
checks is the number of "Wrong name or password" answers (a throttled attempt is answered without a check).
Before the fix, the check came before the hash and the count after it, so a burst of 40 got up to 40 checks.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from .helpers import CSRF, PASSWORD, build_project
from .test_cli import _serve

pytestmark = pytest.mark.hostile

BURST = 40


def _burst(url: str, name: str, addresses: list[str | None]) -> list[str]:
    """One login form's token and cookie (as the review used), then one wrong password per address, all at once."""
    import httpx

    with httpx.Client(base_url=url, timeout=120, verify=False) as client:  # plain HTTP: no TLS set-up
        token = CSRF.search(client.get("/login").text).group(1)
        cookies = dict(client.cookies)
    start = threading.Barrier(len(addresses))
    answers: list[str] = []
    lock = threading.Lock()

    def attempt(address: str | None) -> None:
        headers = {"X-Forwarded-For": address} if address else {}
        with httpx.Client(base_url=url, timeout=120, cookies=cookies, verify=False) as client:
            start.wait()
            data = {"username": name, "password": "wrong wrong", "csrf_token": token}
            text = client.post("/login", data=data, headers=headers, follow_redirects=True).text
        with lock:
            answers.append(text)

    threads = [threading.Thread(target=attempt, args=(address,)) for address in addresses]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(answers) == len(addresses)
    assert all("Wrong name or password" in a or "Too many failed" in a for a in answers), answers
    return answers


def _checks(answers: list[str]) -> int:
    return sum("Wrong name or password" in a for a in answers)


def test_a_parallel_burst_gets_no_more_password_checks_than_the_budgets(tmp_path):
    pytest.importorskip("uvicorn", reason="the annotation app needs the 'web' extra")
    project = build_project(tmp_path)
    project.store().add_user("ann1", PASSWORD)
    project.close()
    # Two servers, started together (the throttle's counts live in each server process's memory): the default one,
    # and one behind a trusted proxy.
    with ThreadPoolExecutor(2) as pool:
        starting = [pool.submit(_serve, project.dir), pool.submit(_serve, project.dir, "--trusted-proxy", "127.0.0.1")]
    started = [future.result() for future in starting if future.exception() is None]
    try:
        for future in starting:
            future.result()  # a server that did not start ends the test here, the other one stopped below
        (_, url), (_, proxied_url) = started

        def default_server() -> tuple[int, int]:
            # One address, one name: 5 checks, for a real account and for a made-up name alike.
            return _checks(_burst(url, "ann1", [None] * BURST)), _checks(_burst(url, "nobody", [None] * BURST))

        def behind_a_proxy() -> tuple[int, int]:
            # Many addresses on one account: 10 checks for the account. One address spraying many names shares its
            # 20; here 40 names from one address in parallel, 5 per name: the per-name budget binds first.
            account = _checks(_burst(proxied_url, "ann1", [f"203.0.113.{i}" for i in range(BURST)]))
            sprays = []
            for i in range(2):
                sprays += _burst(proxied_url, f"made-up-{i}", ["198.51.100.9"] * BURST)
            return account, _checks(sprays)

        # The two servers' bursts run at the same time (each burst's 40 attempts still start together).
        with ThreadPoolExecutor(2) as pool:
            default, proxied = pool.submit(default_server), pool.submit(behind_a_proxy)
            assert default.result() == (5, 5)
            assert proxied.result() == (10, 10)
    finally:
        for process, _ in started:
            process.terminate()
        for process, _ in started:
            process.wait(timeout=30)
