"""Annotation database: images, annotators, sessions, the append-only event log, queues.

SQLite by default (WAL, writes serialised with BEGIN IMMEDIATE); a PostgreSQL URL works the same,
because writes lock the image row (SELECT … FOR UPDATE) and queue claims are guarded by unique
constraints. Events and label matches are only ever inserted; on SQLite and PostgreSQL triggers
make UPDATE and DELETE on them fail.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import JSON, Boolean, DateTime, ForeignKey, Integer, String, UniqueConstraint, event
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from ..core.errors import AnnotateError
from ..util.atomic import open_regular
from .importers import Candidate
from .protocol import (
    MAX_NOTE_LENGTH,
    PANEL_SIZE,
    STAGE1_ANNOTATORS,
    Event,
    EventKind,
    ImageRecord,
    Judgement,
    LabelMatcher,
    Outcome,
    Status,
    check_label_text,
)
from .security import hash_password, needs_rehash, verify_password

MAX_ROW_ID = 2**63 - 1  # SQLite and PostgreSQL (bigint) ids are signed 64-bit integers


def in_range(row_id: int) -> bool:
    """Whether a database row could have this id (larger ones overflow the driver)."""
    return 0 < row_id <= MAX_ROW_ID


def utcnow() -> datetime:
    """The current time in UTC."""
    return datetime.now(UTC)


def aware(moment: datetime) -> datetime:
    """A stored time as an aware UTC datetime (SQLite hands back naive ones)."""
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


class Base(DeclarativeBase):
    """Declarative base of the annotation schema."""


class ImageRow(Base):
    """A candidate image, its evidence, and a cached copy of its protocol status."""

    __tablename__ = "images"
    __table_args__ = (sa.Index("ix_images_queue", "status", "n_assigned", "id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(512), unique=True)
    root: Mapped[str] = mapped_column(String(64))
    path: Mapped[str] = mapped_column(String(1024))
    original_label: Mapped[int | None] = mapped_column(Integer, nullable=True)
    flags: Mapped[list] = mapped_column(JSON, default=list)
    url: Mapped[str | None] = mapped_column(String(2048), nullable=True)
    details: Mapped[dict] = mapped_column(JSON, default=dict)
    evidence: Mapped[dict] = mapped_column(JSON, default=dict)
    # Derived from the events after every write; the event log stays the source of truth.
    status: Mapped[str] = mapped_column(String(16), default=Status.STAGE1.value)
    n_assigned: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class UserRow(Base):
    """An annotator account."""

    __tablename__ = "users"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    password_hash: Mapped[str] = mapped_column(String(256))
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    active: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class SessionRow(Base):
    """A login session; the cookie holds a token whose SHA-256 is the key."""

    __tablename__ = "sessions"
    token_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    csrf_token: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class EventRow(Base):
    """One append-only protocol event (a verdict, a vote, a closing)."""

    __tablename__ = "events"
    __table_args__ = (sa.Index("ix_events_image_kind", "image_id", "kind"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    image_id: Mapped[int] = mapped_column(ForeignKey("images.id"), index=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    verdict: Mapped[str | None] = mapped_column(String(16), nullable=True)
    label: Mapped[str | None] = mapped_column(String(256), nullable=True)
    class_index: Mapped[int | None] = mapped_column(Integer, nullable=True)
    reason: Mapped[str | None] = mapped_column(String(32), nullable=True)
    fine_grained: Mapped[bool] = mapped_column(Boolean, default=False)
    note: Mapped[str | None] = mapped_column(String(MAX_NOTE_LENGTH), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class MatchRow(Base):
    """An append-only declaration that two OOD labels name the same concept."""

    __tablename__ = "label_matches"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    label_a: Mapped[str] = mapped_column(String(256))
    label_b: Mapped[str] = mapped_column(String(256))
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class AssignmentRow(Base):
    """A Stage 1 slot of an image claimed by an annotator's queue."""

    __tablename__ = "assignments"
    __table_args__ = (
        UniqueConstraint("image_id", "slot", name="uq_assignment_slot"),
        UniqueConstraint("user_id", "image_id", name="uq_assignment_user"),
        sa.Index("ix_assignments_user_open", "user_id", "submitted", "id"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    image_id: Mapped[int] = mapped_column(ForeignKey("images.id"))
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    slot: Mapped[int] = mapped_column(Integer)
    submitted: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


_APPEND_ONLY = ("events", "label_matches")


def _sqlite_setup(engine: sa.Engine, path: Path | None) -> None:
    if path is not None:

        @event.listens_for(engine, "do_connect")
        def _before_connect(*_args: Any) -> None:
            # SQLite opens the database's journals again with every connection, and the pool opens connections for
            # as long as the process runs: what was planted beside the database since the last one is refused here.
            _check_database_files(path)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # let the "begin" hook below issue BEGIN itself
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        # Writers take the write lock up front, so read-then-write sequences cannot interleave.
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("write") else "BEGIN")


def _create_private(path: Path) -> None:
    """Create an empty SQLite file readable by its owner only (it holds password hashes and session tokens).

    SQLite gives its -wal and -shm files the database file's mode, so they stay private too.
    """
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    except FileExistsError:
        pass
    except OSError as exc:
        raise AnnotateError(f"cannot create the database file {path}: {exc.strerror}") from None
    _check_database_files(path)


# Bytes 18 and 19 of an SQLite database header: the file format versions, 2 for a database in WAL mode.
_WAL_FORMAT = b"\x02\x02"


def _check_database_files(path: Path) -> None:
    """Refuse, in one line, a database or journal that SQLite must not open (checked before every connection).

    SQLite follows a link to the database, and opens a FIFO it finds as the rollback journal to read it, which
    blocks for ever: the database and its -wal, -shm and -journal files must be regular files, not links. The
    database is in WAL mode and never writes a rollback journal, so a non-empty -journal beside it is another
    database's or a stale one, which SQLite would play back into it, page by page: it is refused too.
    """
    header = b""
    for suffix in ("", "-wal", "-shm", "-journal"):
        file = path.with_name(path.name + suffix)
        if not os.path.lexists(file):
            continue
        try:
            fd = open_regular(file)
        except OSError as exc:
            raise AnnotateError(f"refusing the database file {file}: {exc.strerror or exc}") from None
        try:
            if suffix == "":
                header = os.pread(fd, 2, 18)
            elif suffix == "-journal" and header == _WAL_FORMAT and os.fstat(fd).st_size > 0:
                raise AnnotateError(
                    f"refusing the database file {file}: a rollback journal beside a database in WAL mode, which "
                    "writes none (another database's, or a stale one); SQLite would copy its pages into the "
                    "database: move it away if the database is the one to keep"
                )
        finally:
            os.close(fd)


def _append_only_triggers(conn: sa.Connection) -> None:
    """Triggers that make UPDATE and DELETE on the append-only tables fail."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(
            "CREATE OR REPLACE FUNCTION oodbench_append_only() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION USING MESSAGE = TG_TABLE_NAME || ' is append-only'; END $$"
        )
        for table in _APPEND_ONLY:
            conn.exec_driver_sql(
                f"CREATE OR REPLACE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
                "FOR EACH ROW EXECUTE FUNCTION oodbench_append_only()"
            )
    elif conn.dialect.name == "sqlite":
        for table in _APPEND_ONLY:
            for action in ("UPDATE", "DELETE"):
                conn.exec_driver_sql(
                    f"CREATE TRIGGER IF NOT EXISTS {table}_no_{action.lower()} BEFORE {action} ON {table} "
                    f"BEGIN SELECT RAISE(ABORT, '{table} is append-only'); END"
                )


# -- schema versions ---------------------------------------------------------------------------
# SQLite keeps the version in PRAGMA user_version; other databases in a one-row table. Version 0 is
# every database written before versions existed. To change the schema: change the models (new
# databases get them from create_all), add the step that brings version N-1 to N below, raise
# SCHEMA_VERSION, and test it on a database of the previous version (tests/annotate/data/).
SCHEMA_VERSION = 1
_VERSION_TABLE = "oodbench_schema"


def _read_version(conn: sa.Connection) -> int:
    if conn.dialect.name == "sqlite":
        return int(conn.exec_driver_sql("PRAGMA user_version").scalar_one())
    if not sa.inspect(conn).has_table(_VERSION_TABLE):
        return 0
    return int(conn.exec_driver_sql(f"SELECT version FROM {_VERSION_TABLE}").scalar_one())


def _write_version(conn: sa.Connection, version: int) -> None:
    if conn.dialect.name == "sqlite":
        conn.exec_driver_sql(f"PRAGMA user_version = {int(version)}")
        return
    conn.exec_driver_sql(f"CREATE TABLE IF NOT EXISTS {_VERSION_TABLE} (version INTEGER NOT NULL)")
    conn.exec_driver_sql(f"DELETE FROM {_VERSION_TABLE}")
    conn.exec_driver_sql(f"INSERT INTO {_VERSION_TABLE} (version) VALUES ({int(version)})")


def _to_v1(conn: sa.Connection) -> None:
    """Version 0 -> 1: indexes for the queue and per-image event queries; append-only triggers if missing."""
    for table, name in (
        (EventRow.__table__, "ix_events_image_kind"),
        (AssignmentRow.__table__, "ix_assignments_user_open"),
    ):
        index = next(i for i in table.indexes if i.name == name)
        index.create(conn, checkfirst=True)
    _append_only_triggers(conn)


MIGRATIONS: dict[int, Callable[[sa.Connection], None]] = {1: _to_v1}


@dataclass(frozen=True)
class User:
    """The logged-in annotator, detached from the database session."""

    id: int
    name: str
    is_admin: bool


@dataclass(frozen=True)
class ImageInfo:
    """What pages need to know about an image, detached from the database session."""

    id: int
    key: str
    root: str
    path: str
    original_label: int | None
    flags: tuple[str, ...]
    url: str | None
    evidence: dict
    status: Status


def _image_info(row: ImageRow) -> ImageInfo:
    return ImageInfo(
        row.id,
        row.key,
        row.root,
        row.path,
        row.original_label,
        tuple(row.flags or ()),
        row.url,
        dict(row.evidence or {}),
        Status(row.status),
    )


def _judgement(row: EventRow) -> Judgement | None:
    if row.verdict is None:
        return None
    return Judgement(row.verdict, row.label, row.class_index, row.reason, row.fine_grained)


def _event(row: EventRow, annotator: str) -> Event:
    return Event(row.image_id, annotator, EventKind(row.kind), _judgement(row), row.created_at, row.id)


def _check_password(password: str) -> None:
    if len(password) < 8:
        raise AnnotateError("a password needs at least 8 characters")


class AnnotationStore:
    """All reads and writes of the annotation database."""

    def __init__(self, url: str, *, session_hours: float = 12.0) -> None:
        self.url = url
        self.session_lifetime = timedelta(hours=session_hours)
        try:
            parsed = sa.engine.make_url(url)
        except sa.exc.ArgumentError as exc:
            raise AnnotateError(f"invalid database URL {url!r}: {exc}") from None
        is_sqlite = parsed.get_backend_name() == "sqlite"
        path = Path(parsed.database) if is_sqlite and parsed.database and parsed.database != ":memory:" else None
        if path is not None:
            _create_private(path)
        options: dict[str, Any] = {"connect_args": {"check_same_thread": False, "timeout": 30}} if is_sqlite else {}
        self.engine = sa.create_engine(url, future=True, **options)
        self.is_sqlite = is_sqlite
        self._write_lock = threading.Lock() if is_sqlite else nullcontext()
        if is_sqlite:
            _sqlite_setup(self.engine, path)

    # -- schema ---------------------------------------------------------------------------------
    def create_schema(self) -> None:
        """Create the schema of a new database, or bring an older one up to SCHEMA_VERSION (see `migrate`)."""
        self.migrate()

    def schema_version(self) -> int:
        """The schema version stored in the database (0: before versions, or no schema yet)."""
        with self.engine.connect() as conn:
            return _read_version(conn)

    def migrate(self) -> int:
        """Create a new schema, or apply the forward migrations an older database lacks; returns the old version.

        One transaction holding the write lock: a crash leaves the old version intact, and two processes
        opening the same database migrate it once. A database written by a newer oodbench is refused.
        """
        with self._write_lock, self.engine.connect() as conn:
            conn = conn.execution_options(write=True)
            with conn.begin():
                if self.engine.dialect.name == "postgresql":
                    conn.exec_driver_sql("SELECT pg_advisory_xact_lock(7340163)")  # serialise migrations
                fresh = not sa.inspect(conn).has_table("images")
                old = 0 if fresh else _read_version(conn)
                if old > SCHEMA_VERSION:
                    raise AnnotateError(
                        f"the annotation database has schema version {old}, newer than this oodbench's "
                        f"{SCHEMA_VERSION}; upgrade oodbench"
                    )
                if fresh:
                    Base.metadata.create_all(conn)
                    _append_only_triggers(conn)
                else:
                    for version in range(old + 1, SCHEMA_VERSION + 1):
                        MIGRATIONS[version](conn)
                if fresh or old < SCHEMA_VERSION:
                    _write_version(conn, SCHEMA_VERSION)
        return old

    def close(self) -> None:
        """Release pooled connections."""
        self.engine.dispose()

    @contextmanager
    def read(self) -> Iterator[Session]:
        """A read-only session."""
        with Session(self.engine, expire_on_commit=False) as session:
            yield session

    @contextmanager
    def write(self) -> Iterator[Session]:
        """A session that commits on success; on SQLite it holds the write lock throughout."""
        # SQLite lets one writer in at a time and makes the others poll with growing sleeps; queueing
        # this process's writers on a lock first keeps the wait short and first-come, first-served.
        with self._write_lock, Session(self.engine, expire_on_commit=False) as session:
            session.connection(execution_options={"write": True})
            yield session
            session.commit()

    # -- images ---------------------------------------------------------------------------------
    def add_images(
        self, candidates: Iterable[tuple[Candidate, str, str, dict]], defaults: dict | None = None
    ) -> tuple[int, int]:
        """Insert (candidate, root name, resolved relative path, evidence) rows; existing keys gain new flags.

        New rows start with `defaults` under their evidence. Returns (added, updated). Re-importing
        never touches events or evidence added later, so reruns are safe.
        """
        added = updated = 0
        with self.write() as session:
            existing = {row.key: row for row in session.scalars(sa.select(ImageRow))}
            for cand, root, relpath, evidence in candidates:
                row = existing.get(cand.key)
                if row is None:
                    row = ImageRow(
                        key=cand.key,
                        root=root,
                        path=relpath,
                        original_label=cand.original_label,
                        flags=list(cand.flags),
                        url=cand.url,
                        details=dict(cand.details),
                        evidence={**(defaults or {}), **evidence},
                        status=Status.STAGE1.value,
                        n_assigned=0,
                    )
                    session.add(row)
                    existing[cand.key] = row
                    added += 1
                    continue
                if row.original_label is not None and cand.original_label not in (None, row.original_label):
                    raise AnnotateError(
                        f"image {cand.key} is already in the project with original label "
                        f"{row.original_label}, not {cand.original_label}"
                    )
                flags = list(dict.fromkeys(list(row.flags or []) + list(cand.flags)))
                if flags != row.flags or (row.original_label is None and cand.original_label is not None):
                    row.flags = flags
                    row.original_label = row.original_label if row.original_label is not None else cand.original_label
                    row.details = {**(row.details or {}), **cand.details}
                    row.url = row.url or cand.url
                    row.evidence = {**(row.evidence or {}), **evidence}
                    updated += 1
        return added, updated

    def images(self) -> list[ImageInfo]:
        """Every image, in id order."""
        with self.read() as session:
            return [_image_info(r) for r in session.scalars(sa.select(ImageRow).order_by(ImageRow.id))]

    def image(self, image_id: int) -> ImageInfo | None:
        """One image, or None."""
        if not in_range(image_id):
            return None
        with self.read() as session:
            row = session.get(ImageRow, image_id)
            return None if row is None else _image_info(row)

    def set_evidence(self, updates: dict[int, dict[str, Any]]) -> None:
        """Merge evidence sources into images (image id -> {source: data})."""
        with self.write() as session:
            for row in session.scalars(sa.select(ImageRow).where(ImageRow.id.in_(list(updates)))):
                row.evidence = {**(row.evidence or {}), **updates[row.id]}

    # -- users and sessions ---------------------------------------------------------------------
    def add_user(self, name: str, password: str, *, is_admin: bool = False) -> User:
        """Create an annotator account (names: 1-64 letters, digits, . _ -)."""
        if not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", name):
            raise AnnotateError(f"invalid user name {name!r}: use 1-64 letters, digits, '.', '_' or '-'")
        _check_password(password)
        try:
            with self.write() as session:
                row = UserRow(name=name, password_hash=hash_password(password), is_admin=is_admin, active=True)
                session.add(row)
                session.flush()
                return User(row.id, row.name, row.is_admin)
        except IntegrityError:
            raise AnnotateError(f"user {name!r} already exists") from None

    def set_password(self, name: str, password: str) -> None:
        """Replace a user's password and end their sessions."""
        _check_password(password)
        with self.write() as session:
            row = session.scalar(sa.select(UserRow).where(UserRow.name == name))
            if row is None:
                raise AnnotateError(f"no user named {name!r}")
            row.password_hash = hash_password(password)
            session.execute(sa.delete(SessionRow).where(SessionRow.user_id == row.id))

    def users(self) -> list[User]:
        """All accounts, by name."""
        with self.read() as session:
            rows = session.scalars(sa.select(UserRow).order_by(UserRow.name))
            return [User(r.id, r.name, r.is_admin) for r in rows]

    def has_account(self, name: str) -> bool:
        """Whether an active account has this name."""
        with self.read() as session:
            query = sa.select(UserRow.id).where(UserRow.name == name, UserRow.active.is_(True))
            return session.scalar(query) is not None

    def authenticate(self, name: str, password: str) -> User | None:
        """The user if the password is right, else None (same work either way)."""
        with self.read() as session:
            row = session.scalar(sa.select(UserRow).where(UserRow.name == name, UserRow.active.is_(True)))
        if row is None:
            verify_password(None, password)  # spend the same time as a real check
            return None
        if not verify_password(row.password_hash, password):
            return None
        if needs_rehash(row.password_hash):
            with self.write() as session:
                session.get(UserRow, row.id).password_hash = hash_password(password)
        return User(row.id, row.name, row.is_admin)

    def open_session(self, user: User) -> tuple[str, str]:
        """Start a session: returns (cookie token, CSRF token)."""
        token, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        now = utcnow()
        with self.write() as session:
            session.execute(sa.delete(SessionRow).where(SessionRow.expires_at < now))
            session.add(
                SessionRow(
                    token_hash=hashlib.sha256(token.encode()).hexdigest(),
                    user_id=user.id,
                    csrf_token=csrf,
                    created_at=now,
                    expires_at=now + self.session_lifetime,
                )
            )
        return token, csrf

    def session_user(self, token: str | None) -> tuple[User, str] | None:
        """(user, CSRF token) of a live session, or None."""
        if not token:
            return None
        digest = hashlib.sha256(token.encode()).hexdigest()
        with self.read() as session:
            found = session.execute(
                sa.select(SessionRow, UserRow)
                .join(UserRow, UserRow.id == SessionRow.user_id)
                .where(SessionRow.token_hash == digest)
            ).first()
        if found is None:
            return None
        sess, user = found
        if aware(sess.expires_at) < utcnow() or not user.active:
            return None
        return User(user.id, user.name, user.is_admin), sess.csrf_token

    def close_session(self, token: str | None) -> None:
        """End a session (logout)."""
        if token:
            with self.write() as session:
                session.execute(
                    sa.delete(SessionRow).where(SessionRow.token_hash == hashlib.sha256(token.encode()).hexdigest())
                )

    # -- protocol -------------------------------------------------------------------------------
    def _matcher(self, session: Session) -> LabelMatcher:
        return LabelMatcher(session.execute(sa.select(MatchRow.label_a, MatchRow.label_b).order_by(MatchRow.id)))

    def _record(self, session: Session, image_id: int, matcher: LabelMatcher) -> ImageRecord:
        rows = session.execute(
            sa.select(EventRow, UserRow.name)
            .join(UserRow, UserRow.id == EventRow.user_id)
            .where(EventRow.image_id == image_id)
            .order_by(EventRow.id)
        )
        return ImageRecord.from_events(
            (_event(ev, name) for ev, name in rows),
            matcher,
        )

    def _locked_image(self, session: Session, image_id: int) -> ImageRow:
        if not in_range(image_id):
            raise AnnotateError(f"no image with id {image_id}")
        row = session.scalar(sa.select(ImageRow).where(ImageRow.id == image_id).with_for_update())
        if row is None:
            raise AnnotateError(f"no image with id {image_id}")
        return row

    def _append(
        self, user: User, image_id: int, kind: EventKind, judgement: Judgement | None, note: str | None = None
    ) -> Outcome:
        # New labels only: events already stored replay as they are, whatever they hold.
        if judgement is not None and judgement.label is not None:
            check_label_text(judgement.label)
        if note and len(note) > MAX_NOTE_LENGTH:  # refused whole: a note cut short would say something else
            raise AnnotateError(f"a note has at most {MAX_NOTE_LENGTH:,} characters; this one has {len(note):,}")
        with self.write() as session:
            image = self._locked_image(session, image_id)
            # Checked inside the write transaction: a concurrent `annotate release` cannot slip in between.
            if kind is EventKind.STAGE1 and session.scalar(self._assignment_query(user, image_id)) is None:
                raise AnnotateError("this image is not in your queue")
            matcher = self._matcher(session)
            record = self._record(session, image_id, matcher)
            now = utcnow()
            new = Event(image_id, user.name, kind, judgement, now, 0)
            record.apply(new, matcher)  # raises if the protocol refuses the event
            j = judgement
            row = EventRow(
                image_id=image_id,
                user_id=user.id,
                kind=kind.value,
                created_at=now,
                verdict=None if j is None else j.verdict.value,
                label=None if j is None else j.label,
                class_index=None if j is None else j.class_index,
                reason=None if j is None else j.reason,
                fine_grained=bool(j and j.fine_grained),
                note=note or None,
            )
            session.add(row)
            outcome = record.outcome(matcher)
            image.status = outcome.status.value
            if kind is EventKind.STAGE1:
                session.execute(
                    sa.update(AssignmentRow)
                    .where(AssignmentRow.image_id == image_id, AssignmentRow.user_id == user.id)
                    .values(submitted=True)
                )
            return outcome

    def submit_stage1(self, user: User, image_id: int, judgement: Judgement) -> Outcome:
        """Record an independent verdict by an annotator the image is assigned to."""
        return self._append(user, image_id, EventKind.STAGE1, judgement)

    def vote_stage3(self, user: User, image_id: int, judgement: Judgement, note: str | None = None) -> Outcome:
        """Record (or revise) a panel member's vote in the joint review."""
        return self._append(user, image_id, EventKind.STAGE3, judgement, note)

    def close_stage3(self, user: User, image_id: int) -> Outcome:
        """End a joint review without consensus: the image becomes ambiguous."""
        return self._append(user, image_id, EventKind.CLOSE, None)

    def add_match(self, user: User, label_a: str, label_b: str) -> int:
        """Declare two OOD labels the same concept; returns how many images changed status."""
        LabelMatcher([(label_a, label_b)])  # validates both labels
        check_label_text(label_a)
        check_label_text(label_b)
        changed = 0
        with self.write() as session:
            session.add(MatchRow(label_a=label_a.strip(), label_b=label_b.strip(), user_id=user.id))
            session.flush()
            matcher = self._matcher(session)
            for image in session.scalars(
                sa.select(ImageRow).where(ImageRow.status == Status.STAGE3.value).with_for_update()
            ):
                status = self._record(session, image.id, matcher).outcome(matcher).status.value
                if status != image.status:
                    image.status = status
                    changed += 1
        return changed

    def matches(self) -> list[tuple[str, str, str, datetime]]:
        """All explicit label matches: (label a, label b, who, when)."""
        with self.read() as session:
            rows = session.execute(
                sa.select(MatchRow.label_a, MatchRow.label_b, UserRow.name, MatchRow.created_at)
                .join(UserRow, UserRow.id == MatchRow.user_id)
                .order_by(MatchRow.id)
            )
            return [(a, b, who, aware(when)) for a, b, who, when in rows]

    def outcome(self, image_id: int) -> Outcome:
        """The protocol state of one image, replayed from its events."""
        with self.read() as session:
            matcher = self._matcher(session)
            return self._record(session, image_id, matcher).outcome(matcher)

    def events(self, image_id: int | None = None) -> list[dict[str, Any]]:
        """The event log (optionally of one image) as plain dicts, in order."""
        with self.read() as session:
            query = (
                sa.select(EventRow, UserRow.name, ImageRow.key)
                .join(UserRow, UserRow.id == EventRow.user_id)
                .join(ImageRow, ImageRow.id == EventRow.image_id)
                .order_by(EventRow.id)
            )
            if image_id is not None:
                query = query.where(EventRow.image_id == image_id)
            return [
                {
                    "seq": ev.id,
                    "image_id": ev.image_id,
                    "image": key,
                    "annotator": name,
                    "kind": ev.kind,
                    "verdict": ev.verdict,
                    "label": ev.label,
                    "class_index": ev.class_index,
                    "reason": ev.reason,
                    "fine_grained": ev.fine_grained,
                    "note": ev.note,
                    "at": aware(ev.created_at).isoformat(),
                }
                for ev, name, key in session.execute(query)
            ]

    def replay_all(self) -> dict[int, Outcome]:
        """Outcome of every image, replayed from the full event log (images without events included)."""
        with self.read() as session:
            matcher = self._matcher(session)
            rows = session.execute(
                sa.select(EventRow, UserRow.name).join(UserRow, UserRow.id == EventRow.user_id).order_by(EventRow.id)
            )
            per_image: dict[int, list[Event]] = {}
            for ev, name in rows:
                per_image.setdefault(ev.image_id, []).append(_event(ev, name))
            ids = session.scalars(sa.select(ImageRow.id).order_by(ImageRow.id)).all()
        return {i: ImageRecord.from_events(per_image.get(i, []), matcher).outcome(matcher) for i in ids}

    # -- queues ---------------------------------------------------------------------------------
    def pending_stage1(self, user: User) -> int | None:
        """The first image claimed by the annotator and still waiting for their verdict (never claims)."""
        with self.read() as session:
            return session.scalar(self._pending_query(user))

    def next_stage1(self, user: User) -> int | None:
        """The next image in the annotator's queue, claiming a free Stage 1 slot when needed."""
        pending = self.pending_stage1(user)
        if pending is not None:
            return pending
        for _attempt in range(20):
            try:
                with self.write() as session:
                    pending = session.scalar(self._pending_query(user))
                    if pending is not None:
                        return pending
                    image = session.scalar(
                        sa.select(ImageRow)
                        .where(*self._free_slot(user))
                        # Half-claimed images first, so pairs complete and reach Stage 2 early.
                        .order_by(ImageRow.n_assigned.desc(), ImageRow.id)
                        .limit(1)
                        .with_for_update(skip_locked=not self.is_sqlite)
                    )
                    if image is None:
                        return None
                    slot = image.n_assigned
                    claimed = session.execute(
                        sa.update(ImageRow)
                        .where(ImageRow.id == image.id, ImageRow.n_assigned == slot)
                        .values(n_assigned=slot + 1)
                        .execution_options(synchronize_session=False)
                    ).rowcount
                    if claimed != 1:
                        session.rollback()
                        continue
                    session.add(AssignmentRow(image_id=image.id, user_id=user.id, slot=slot, submitted=False))
                    return image.id
            except IntegrityError:
                continue  # another annotator took the slot first (PostgreSQL); try the next image
        raise AnnotateError("could not claim an image after 20 attempts; the database is very busy")

    @staticmethod
    def _free_slot(user: User) -> tuple[sa.ColumnElement[bool], ...]:
        """Conditions on ImageRow: in Stage 1, a slot free, not already in this user's queue."""
        mine = sa.select(AssignmentRow.id).where(
            AssignmentRow.image_id == ImageRow.id, AssignmentRow.user_id == user.id
        )
        return (ImageRow.status == Status.STAGE1.value, ImageRow.n_assigned < STAGE1_ANNOTATORS, ~sa.exists(mine))

    @staticmethod
    def _pending_query(user: User) -> sa.Select:
        return (
            sa.select(AssignmentRow.image_id)
            .join(ImageRow, ImageRow.id == AssignmentRow.image_id)
            .where(
                AssignmentRow.user_id == user.id,
                AssignmentRow.submitted.is_(False),
                ImageRow.status == Status.STAGE1.value,
            )
            .order_by(AssignmentRow.id)
            .limit(1)
        )

    @staticmethod
    def _assignment_query(user: User, image_id: int) -> sa.Select:
        return sa.select(AssignmentRow.id).where(AssignmentRow.image_id == image_id, AssignmentRow.user_id == user.id)

    def is_assigned(self, user: User, image_id: int) -> bool:
        """Whether the image is (or was) in this annotator's Stage 1 queue."""
        if not in_range(image_id):
            return False
        with self.read() as session:
            return session.scalar(self._assignment_query(user, image_id)) is not None

    def may_view(self, user: User, image_id: int) -> bool:
        """Whether the user may see the image: admins all, annotators their own queue's and joint reviews'."""
        if user.is_admin:
            return True
        if not in_range(image_id):
            return False
        reviewed = sa.select(EventRow.id).where(
            EventRow.image_id == image_id, EventRow.kind.in_([EventKind.STAGE3.value, EventKind.CLOSE.value])
        )
        with self.read() as session:
            status = session.scalar(sa.select(ImageRow.status).where(ImageRow.id == image_id))
            if status is None:
                return False
            if status == Status.STAGE3.value or session.scalar(self._assignment_query(user, image_id)) is not None:
                return True
            return session.scalar(sa.select(sa.exists(reviewed))) is True

    def claimable(self, user: User) -> int:
        """How many images have a free Stage 1 slot this annotator could claim."""
        with self.read() as session:
            return int(session.scalar(sa.select(sa.func.count()).select_from(ImageRow).where(*self._free_slot(user))))

    def own_stage1(self, user: User, image_id: int) -> Judgement | None:
        """The annotator's own latest Stage 1 verdict on an image (never anyone else's)."""
        with self.read() as session:
            row = session.scalar(
                sa.select(EventRow)
                .where(
                    EventRow.image_id == image_id, EventRow.user_id == user.id, EventRow.kind == EventKind.STAGE1.value
                )
                .order_by(EventRow.id.desc())
                .limit(1)
            )
            return None if row is None else _judgement(row)

    def release(self, name: str) -> int:
        """Return an annotator's unsubmitted claims to the pool; returns how many."""
        with self.write() as session:
            user = session.scalar(sa.select(UserRow).where(UserRow.name == name))
            if user is None:
                raise AnnotateError(f"no user named {name!r}")
            rows = session.scalars(
                sa.select(AssignmentRow).where(AssignmentRow.user_id == user.id, AssignmentRow.submitted.is_(False))
            ).all()
            for assignment in rows:
                image = self._locked_image(session, assignment.image_id)
                # Keep slots dense: the highest slot of the image moves into the freed one.
                session.delete(assignment)
                session.flush()
                last = session.scalar(
                    sa.select(AssignmentRow).where(
                        AssignmentRow.image_id == image.id, AssignmentRow.slot > assignment.slot
                    )
                )
                if last is not None:
                    last.slot = assignment.slot
                image.n_assigned -= 1
            return len(rows)

    def stage3_images(self) -> list[ImageInfo]:
        """Images waiting for joint review."""
        with self.read() as session:
            rows = session.scalars(
                sa.select(ImageRow).where(ImageRow.status == Status.STAGE3.value).order_by(ImageRow.id)
            )
            return [_image_info(r) for r in rows]

    def stage3_votes(self) -> dict[int, list[str]]:
        """Panel members who voted so far, per image waiting for joint review (a revised vote counts once)."""
        with self.read() as session:
            rows = session.execute(
                sa.select(EventRow.image_id, UserRow.name)
                .join(UserRow, UserRow.id == EventRow.user_id)
                .join(ImageRow, ImageRow.id == EventRow.image_id)
                .where(ImageRow.status == Status.STAGE3.value, EventRow.kind == EventKind.STAGE3.value)
                .order_by(EventRow.id)
            )
            votes: dict[int, list[str]] = {}
            for image_id, name in rows:
                voters = votes.setdefault(image_id, [])
                if name not in voters:
                    voters.append(name)
            return votes

    def stage3_open_for(self, user: User) -> list[int]:
        """Images in joint review that still need this user's vote: not voted yet, panel not full, in id order."""
        votes = sa.select(EventRow.user_id).where(
            EventRow.image_id == ImageRow.id, EventRow.kind == EventKind.STAGE3.value
        )
        panel = sa.select(sa.func.count(sa.distinct(EventRow.user_id))).where(
            EventRow.image_id == ImageRow.id, EventRow.kind == EventKind.STAGE3.value
        )
        with self.read() as session:  # ids only, one query: every Stage 3 page asks this
            return list(
                session.scalars(
                    sa.select(ImageRow.id)
                    .where(
                        ImageRow.status == Status.STAGE3.value,
                        ~sa.exists(votes.where(EventRow.user_id == user.id)),
                        panel.scalar_subquery() < PANEL_SIZE,
                    )
                    .order_by(ImageRow.id)
                )
            )

    def stage1_history(self, user: User) -> list[tuple[ImageInfo, Judgement]]:
        """The user's own Stage 1 verdicts (the latest per image), in the order they were first given."""
        with self.read() as session:
            rows = session.execute(
                sa.select(EventRow, ImageRow)
                .join(ImageRow, ImageRow.id == EventRow.image_id)
                .where(EventRow.user_id == user.id, EventRow.kind == EventKind.STAGE1.value)
                .order_by(EventRow.id)
            )
            latest: dict[int, tuple[ImageInfo, Judgement]] = {}
            for event_row, image_row in rows:
                judgement = _judgement(event_row)
                if judgement is not None:
                    first = latest.get(image_row.id)
                    latest[image_row.id] = (first[0] if first else _image_info(image_row), judgement)
            return list(latest.values())

    def progress(self, user: User | None = None) -> dict[str, int]:
        """Counts by status, plus the user's own submitted and pending Stage 1 items."""
        with self.read() as session:
            counts = dict(session.execute(sa.select(ImageRow.status, sa.func.count()).group_by(ImageRow.status)).all())
            result = {s.value: int(counts.get(s.value, 0)) for s in Status}
            result["total"] = sum(result.values())
            if user is not None:
                for flag, key in ((True, "mine_done"), (False, "mine_open")):
                    result[key] = int(
                        session.scalar(
                            sa.select(sa.func.count())
                            .select_from(AssignmentRow)
                            .where(AssignmentRow.user_id == user.id, AssignmentRow.submitted.is_(flag))
                        )
                    )
            return result
