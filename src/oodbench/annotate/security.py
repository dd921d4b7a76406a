"""Password hashing (Argon2id) and CSRF token helpers for the annotation app."""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError
from itsdangerous import BadSignature, URLSafeSerializer

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


class LoginThrottle:
    """Counts failed logins per (client, name) and per client, in a bounded in-memory table.

    A client that failed `per_name` times on one name within `window_s` seconds waits before trying that
    name again; one that failed `per_client` times on any names waits before trying any. Nothing is
    counted per name alone, so failures from one client never lock a user out on another. Each key keeps
    at most its limit of timestamps, and the table at most `max_keys` keys (the least recently failed go
    first), so memory stays bounded whatever an attacker sends.
    """

    def __init__(
        self,
        per_name: int = 5,
        per_client: int = 20,
        window_s: float = 300.0,
        max_keys: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if per_name < 1 or per_client < 1 or max_keys < 2:
            raise ValueError("throttle limits must be positive")
        self.per_name = per_name
        self.per_client = per_client
        self.window_s = window_s
        self.max_keys = max_keys
        self._clock = clock
        self._failures: OrderedDict[tuple[str, ...], deque[float]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._failures)

    def _full(self, key: tuple[str, ...], limit: int, now: float) -> bool:
        times = self._failures.get(key)
        return times is not None and len(times) >= limit and now - times[0] < self.window_s

    def blocked(self, client: str, name: str) -> bool:
        """Whether this client must wait before trying this name (checked before any password hashing)."""
        now = self._clock()
        with self._lock:
            return self._full(("client", client), self.per_client, now) or self._full(
                ("name", client, name), self.per_name, now
            )

    def failed(self, client: str, name: str) -> None:
        """Count one failed attempt of a client on a name."""
        now = self._clock()
        with self._lock:
            for key, limit in ((("client", client), self.per_client), (("name", client, name), self.per_name)):
                times = self._failures.get(key)
                if times is None:
                    times = self._failures[key] = deque(maxlen=limit)
                times.append(now)
                self._failures.move_to_end(key)
            while len(self._failures) > self.max_keys:
                self._failures.popitem(last=False)

    def succeeded(self, client: str, name: str) -> None:
        """Forget the client's failures on this name (its failures on other names still count)."""
        with self._lock:
            self._failures.pop(("name", client, name), None)
