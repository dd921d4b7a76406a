"""Password hashing (Argon2id), CSRF tokens, login throttling and client addresses for the annotation app."""

from __future__ import annotations

import hmac
import ipaddress
import secrets
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError
from itsdangerous import BadSignature, URLSafeSerializer, URLSafeTimedSerializer

from ..core.errors import AnnotateError

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_HASHER = PasswordHasher()  # argon2-cffi's defaults (RFC 9106 low-memory profile)
_DUMMY_HASHES: dict[int, str] = {}


def _dummy_hash() -> str:
    """A hash to verify against when the user does not exist, so a wrong name costs as much as a wrong password."""
    key = id(_HASHER)
    if key not in _DUMMY_HASHES:
        _DUMMY_HASHES[key] = _HASHER.hash(secrets.token_urlsafe(16))
    return _DUMMY_HASHES[key]


def hash_password(password: str) -> str:
    """Argon2id hash of a password."""
    return _HASHER.hash(password)


def verify_password(stored_hash: str | None, password: str) -> bool:
    """Whether the password matches the stored hash (None: never, after the same amount of work)."""
    try:
        return _HASHER.verify(stored_hash or _dummy_hash(), password) and stored_hash is not None
    except (VerifyMismatchError, VerificationError, InvalidHashError):
        return False


def needs_rehash(stored_hash: str) -> bool:
    """Whether a hash was made with weaker parameters than the current ones."""
    return _HASHER.check_needs_rehash(stored_hash)


def tokens_equal(expected: str | None, given: str | None) -> bool:
    """Constant-time comparison of two tokens; missing tokens never match."""
    if not expected or not given:
        return False
    return hmac.compare_digest(expected.encode(), given.encode())


class LoginCsrf:
    """Double-submit CSRF token for the login form, before any session exists.

    The cookie holds the token signed with the project secret; the form echoes the raw token.
    """

    def __init__(self, secret: str) -> None:
        self._serializer = URLSafeSerializer(secret, salt="oodbench-login-csrf")

    def issue(self) -> tuple[str, str]:
        """A fresh (form token, cookie value) pair."""
        token = secrets.token_urlsafe(24)
        return token, self._serializer.dumps(token)

    def check(self, cookie: str | None, form_token: str | None) -> bool:
        """Whether the form token matches the signed cookie."""
        if not cookie:
            return False
        try:
            token = self._serializer.loads(cookie)
        except BadSignature:
            return False
        return tokens_equal(str(token), form_token)


@dataclass(frozen=True)
class Reservation:
    """An attempt counted as a failure before its password is checked (`LoginThrottle.reserve`)."""

    keys: tuple[tuple[str, ...], ...]
    account: str | None  # the real account whose budget it took, kept apart from the evictable keys
    at: float


class LoginThrottle:
    """Counts failed logins so that guessing stays slow and no stranger can lock a colleague out.

    Four budgets, each counted within `window_s` seconds:

    - a client (an address) gets `per_name` failures on one name,
    - and `per_client` failures on all names together (one password sprayed over many names);
    - an account gets `per_account` failures from all clients together, so that many addresses do not
      multiply the guesses on one account;
    - a browser that has logged in to an account before (it shows that account's device token, see
      `DeviceTokens`) gets `per_name` failures of its own on that account and is judged by nothing else.

    The account budget is what a stranger can exhaust, so it never applies to a recognised browser: a
    colleague who has logged in before from their browser logs in whatever anyone else sends. Memory stays
    bounded whatever an attacker sends: each key keeps at most its limit of timestamps; the table of client,
    device and unknown-name keys holds at most `max_keys` (the least recently failed go first); the table of
    real accounts holds one key per account and is never evicted, so a flood of invented names cannot reset
    the budget of a real one.

    The login uses `reserve` and `release`: an attempt is counted as failed before its password is checked and
    the count is taken back when the password was right, both under one lock, so that no number of parallel
    attempts gets more password checks than the budgets allow.
    """

    def __init__(
        self,
        per_name: int = 5,
        per_client: int = 20,
        per_account: int = 10,
        window_s: float = 300.0,
        max_keys: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if per_name < 1 or per_client < 1 or per_account < 1 or max_keys < 2:
            raise ValueError("throttle limits must be positive")
        self.per_name = per_name
        self.per_client = per_client
        self.per_account = per_account
        self.window_s = window_s
        self.max_keys = max_keys
        self._clock = clock
        self._failures: OrderedDict[tuple[str, ...], deque[float]] = OrderedDict()
        self._accounts: dict[str, deque[float]] = {}  # real accounts only: bounded by their number
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._failures) + len(self._accounts)

    def _full(self, times: deque[float] | None, limit: int, now: float) -> bool:
        return times is not None and len(times) >= limit and now - times[0] < self.window_s

    def blocked(self, client: str, name: str, device: str | None = None) -> bool:
        """Whether this attempt must wait (checked before any password hashing).

        `device` is the id of a valid device token for `name` (None without one).
        """
        now = self._clock()
        with self._lock:
            return self._blocked(client, name, device, now)

    def _blocked(self, client: str, name: str, device: str | None, now: float) -> bool:
        if device is not None:
            return self._full(self._failures.get(("device", device, name)), self.per_name, now)
        account = self._accounts.get(name) or self._failures.get(("account", name))
        return (
            self._full(self._failures.get(("client", client)), self.per_client, now)
            or self._full(self._failures.get(("name", client, name)), self.per_name, now)
            or self._full(account, self.per_account, now)
        )

    def reserve(
        self, client: str, name: str, device: str | None = None, *, known_account: bool = False
    ) -> Reservation | None:
        """Count this attempt as failed before its password is checked; None when it must wait instead.

        Checking the budgets and counting happen under one lock, so parallel attempts cannot all pass the check
        before any of them is counted. Give the reservation back with `release` when the password was right.
        """
        now = self._clock()
        with self._lock:
            if self._blocked(client, name, device, now):
                return None
            return self._record(client, name, device, known_account, now)

    def release(self, reservation: Reservation) -> None:
        """Take back a reserved attempt whose password was right (it is not a failure)."""
        with self._lock:
            tables: list[deque[float] | None] = [self._failures.get(key) for key in reservation.keys]
            if reservation.account is not None:
                tables.append(self._accounts.get(reservation.account))
            for times in tables:
                if times is not None and reservation.at in times:
                    times.remove(reservation.at)

    def _count(self, key: tuple[str, ...], limit: int, now: float) -> None:
        times = self._failures.get(key)
        if times is None:
            times = self._failures[key] = deque(maxlen=limit)
        times.append(now)
        self._failures.move_to_end(key)

    def failed(self, client: str, name: str, device: str | None = None, *, known_account: bool = False) -> None:
        """Count one failed attempt; `known_account`: the name is a real account (its count is never evicted)."""
        now = self._clock()
        with self._lock:
            self._record(client, name, device, known_account, now)

    def _record(self, client: str, name: str, device: str | None, known_account: bool, now: float) -> Reservation:
        """Count one failure at `now` in every budget of this attempt (the lock is held)."""
        account = None
        if device is not None:
            keys: tuple[tuple[str, ...], ...] = (("device", device, name),)
            self._count(keys[0], self.per_name, now)
        else:
            keys = (("client", client), ("name", client, name))
            self._count(keys[0], self.per_client, now)
            self._count(keys[1], self.per_name, now)
            if known_account:
                account = name
                self._accounts.setdefault(name, deque(maxlen=self.per_account)).append(now)
            else:  # invented names are counted too, or the answer would tell which names exist
                keys += (("account", name),)
                self._count(keys[2], self.per_account, now)
        while len(self._failures) > self.max_keys:
            self._failures.popitem(last=False)
        return Reservation(keys, account, now)

    def succeeded(self, client: str, name: str, device: str | None = None) -> None:
        """Forget this client's (or device's) failures on this name; its other failures still count."""
        with self._lock:
            self._failures.pop(("name", client, name), None)
            if device is not None:
                self._failures.pop(("device", device, name), None)


class DeviceTokens:
    """Signed, dated tokens a browser receives when it logs in: later proof that it knew the password.

    The token names the account and a random device id, signed with the project secret, so it can be
    neither forged nor moved to another account. `LoginThrottle` judges a browser that shows one by its
    own failures only.
    """

    def __init__(self, secret: str, max_age_s: float = 30 * 86400) -> None:
        self._serializer = URLSafeTimedSerializer(secret, salt="oodbench-login-device")
        self.max_age_s = max_age_s

    def issue(self, name: str, device: str | None = None) -> str:
        """A cookie value recognising this browser for `name` (a fresh device id unless one is given)."""
        return self._serializer.dumps({"name": name, "device": device or secrets.token_urlsafe(16)})

    def device_for(self, cookie: str | None, name: str) -> str | None:
        """The device id of a valid, unexpired token for `name`, else None."""
        if not cookie:
            return None
        try:
            data = self._serializer.loads(cookie, max_age=self.max_age_s)
        except BadSignature:  # includes SignatureExpired
            return None
        if not isinstance(data, dict) or data.get("name") != name or not isinstance(data.get("device"), str):
            return None
        return data["device"]


def parse_trusted_proxies(values: Sequence[str]) -> tuple[IPNetwork, ...]:
    """The networks of `--trusted-proxy` values (an address or a CIDR network each)."""
    networks = []
    for value in values:
        try:
            networks.append(ipaddress.ip_network(value.strip(), strict=False))
        except ValueError:
            raise AnnotateError(
                f"--trusted-proxy {value!r} is not an IP address or network (e.g. 10.0.0.5 or 10.0.0.0/24)"
            ) from None
    return tuple(networks)


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address of a socket peer or X-Forwarded-For hop ("a.b.c.d", "a.b.c.d:port", "[v6]:port", "v6")."""
    text = text.strip()
    if text.startswith("[") and "]" in text:
        text = text[1 : text.index("]")]
    elif text.count(":") == 1:
        text = text.split(":", 1)[0]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def client_address(peer: str | None, forwarded_for: Sequence[str], trusted: Sequence[IPNetwork]) -> str:
    """The address login throttling counts for a request.

    The socket's peer, unless that peer is a trusted proxy: then the nearest X-Forwarded-For hop (read from
    the right, the end the proxies append to) that is not itself a trusted proxy. Without trusted proxies
    the headers are never read, so a client cannot choose its address.
    """
    if not peer:
        return "unknown"
    peer_ip = _ip(peer)
    if not trusted or peer_ip is None or not any(peer_ip in net for net in trusted):
        return peer
    hops = [hop.strip() for header in forwarded_for for hop in header.split(",") if hop.strip()]
    for hop in reversed(hops):
        hop_ip = _ip(hop)
        if hop_ip is None:
            return hop[:64]  # written by the trusted proxy, so not the client's choice; bounded all the same
        if not any(hop_ip in net for net in trusted):
            return str(hop_ip)
    return str(_ip(hops[0])) if hops else peer
