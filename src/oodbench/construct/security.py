"""Password hashing (Argon2id) and CSRF token helpers for the annotation app."""

from __future__ import annotations

import hmac
import secrets

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
