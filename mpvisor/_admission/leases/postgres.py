"""How do processes on many hosts share slots? The `postgresql://` lease store.

Slots live in two tables of a PostgreSQL database that every host can reach (created on first
use, their version in `mpvisor_meta`): `mpvisor_slots` (one row per slot, its last fencing
token) and `mpvisor_requests` (one row per request: queued, or the slot's owner). A lease is a
row, not a connection: it has an expiry on the *database's* clock (`ttl` seconds, renewed every
`ttl / 12` by its owner, and every `ttl / 24` while the store does not answer: `store.py`), so it survives reconnects and works through a transaction-pooling
PgBouncer; a request whose owner stopped renewing is gone once it expires. Every change of a
slot happens in one transaction that locks the slot's row (`SELECT ... FOR UPDATE`), and then
notifies the slot's channel (`LISTEN mpvisor_slot`), so the waiting requests re-read at once.

| request | in the slot's transaction |
|---|---|
| any step | expired rows are deleted; with no live owner, the queue's head (least `position`) whose waiter is not known to be dead (`_DEAD`) is granted: the slot's `last_token` + 1 is its fencing token; its `expires` stays what its own last renewal, on its own host's `ttl`, made it (hosts may give different TTLs) |
| any request, first | expired rows of every slot are deleted (at most 100, those no other transaction holds) |
| `queue` | appended (`position` from a sequence); refused `queue_full` past `MAX_QUEUE` |
| `drop` | refused `slot_busy` if the slot has an owner or a queue (of waiters not known to be dead), else granted |
| `replace` | becomes the head (before every queued one; a queued head it displaces is `superseded_by_replace`), and the owner is asked to retire (`revoke`) |
| renew | `expires = now() + ttl` while the row is the owner's; a revoke asked is the owner's `on_revoke`; the row gone is its `on_lost` (expired, or deleted by someone else before its expiry: `FREED`) |
| a waiter's row gone (it expired while the waiter was cut off or paused, a grant too) | submitted again as a `queue` request, whatever its policy: at the end of the queue, retiring or superseding nobody |
| `release`, `withdraw`, superseded | the row is deleted (a withdraw that crossed its grant gives the lease back; one the store does not take within `WITHDRAW_WAIT` says so, `LeaseError`: the row lapses by its expiry) |

A grant carries a fencing token (`Decision.token`) that strictly increases per slot across all
hosts; the controller puts it in every attempt's environment (`MPVISOR_FENCING_TOKEN`).
An owner that cannot renew is told (`on_revoke`), and the controller retires its task; the
fork server that runs the owner's attempts holds the lease's deadline (a fence, renewed with
each renewal) and stops the tree two thirds of a TTL after the last renewal even if the
supervising process itself is paused. A renewal's time is taken before the transaction that
got through (`_transaction`), not before earlier tries that the store did not answer.
"""

from __future__ import annotations

import functools
import os
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

from mpvisor._admission.leases.store import (
    DEFAULT_LEASE_TTL,
    RENEW_EVERY,
    SILENT_AFTER,
    Decision,
    LeaseError,
    OnSilent,
    Pid,
    Policy,
    retry_every,
)

SCHEMA_VERSION = 1
MAX_QUEUE = 1000  # pending requests per slot, as the slot server allows
CHANNEL = "mpvisor_slot"
MIN_OP_TIMEOUT, MAX_OP_TIMEOUT = 2.0, 10.0  # seconds: the bounds of a statement timeout (a quarter TTL)
# how a lease whose row was gone before it could expire, by this host's count, ended (`on_lost`'s
# `why`): deleted (the guide's `free.sql`), or expired by a database clock that stepped forward
FREED = ("was freed by someone else: its row in the store was gone before its expiry (or the database's clock "
         "stepped forward)")
# seconds a withdraw waits for the store to take it before it says it could not tell it: less
# than the driver's `RELEASE_WAIT` (2 s), so that its words (with the TTL) are what is said
WITHDRAW_WAIT = 1.5
UNANSWERED = "no answer in time"  # what a renewal met that only says nothing came back (`_said` None)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS mpvisor_meta (key text PRIMARY KEY, value text NOT NULL);
CREATE TABLE IF NOT EXISTS mpvisor_slots (slot text PRIMARY KEY, last_token bigint NOT NULL DEFAULT 0);
CREATE SEQUENCE IF NOT EXISTS mpvisor_positions;
CREATE TABLE IF NOT EXISTS mpvisor_requests (
    id bigserial PRIMARY KEY,
    slot text NOT NULL REFERENCES mpvisor_slots (slot),
    name text NOT NULL,
    host text NOT NULL,
    pid integer NOT NULL,
    state text NOT NULL CHECK (state IN ('queued', 'granted', 'superseded')),
    position bigint NOT NULL,
    token bigint,
    revoke boolean NOT NULL DEFAULT false,
    since timestamptz,
    expires timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS mpvisor_requests_slot ON mpvisor_requests (slot, state, position);
"""


# A waiter's liveness: while it waits, its listening connection holds a session advisory lock
# on (_ALIVE_CLASS, its request's id), which the server releases with the session when the
# waiting process dies (killed, or interrupted while the store was down, so that it could not
# withdraw), and each of its looks sets its row's `since` (NULL while it does not hold the lock).
# The head of a queue is granted only if its waiter is not known to be dead (`_DEAD`): it was seen
# holding the lock, the lock is free now, and it was seen since the server started, or the server
# has been up long enough for a live waiter to have looked again (a quarter of its own TTL,
# `expires - since`: it looks every sixth and retries every twenty-fourth). A dead waiter is
# skipped, not deleted (it expires on its own); through a transaction-pooling PgBouncer the lock
# may outlive its waiter, which then holds its place until its row expires, as without the lock.
# A waiter whose row expired (paused past a grant) submits again under a new id, and moves its
# lock to that id (`_listening`): else its new row looks dead and is skipped for good.
_ALIVE_CLASS = 1836086899  # 'mpvs'
_ALIVE_MOD = 2147483647
_UNLOCKED = (f"r.since IS NOT NULL AND NOT EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' "
             f"AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) AND l.classid::bigint = "
             f"{_ALIVE_CLASS} AND l.objid::bigint = mod(r.id, {_ALIVE_MOD}) AND l.objsubid = 2 AND l.granted)")
_DEAD = (f"{_UNLOCKED} AND (r.since >= pg_postmaster_start_time() OR now() >= pg_postmaster_start_time() "
         f"+ (r.expires - r.since) / 4)")
# Not yet known either way: last seen holding its lock before the server started, which has not
# been up a quarter of its TTL (a live waiter may not have looked again yet). Such a head is not
# granted until it is known: it looks again (and is granted), or it is dead by then (and skipped).
# (It was granted: one that died while the store was down then held the slot until its row expired.)
_UNKNOWN = _UNLOCKED


class Unreachable(LeaseError):
    """The store did not answer (refused, timed out, restarting, or the connection was lost),
    or is at its connection limit (`at_capacity`), as opposed to answering with a refusal (a
    wrong password, no such database): try again later. `unheard`: nothing at all came back in
    time (the connect timed out, or its connection was closed under it), so its words say no
    more than that it did not answer (and "server closed the connection" is then no server's doing)."""

    def __init__(self, message: str, at_capacity: bool = False, unheard: bool = False) -> None:
        super().__init__(message)
        self.at_capacity = at_capacity
        self.unheard = unheard


# What libpq says when the server did not answer (refused, down, restarting, a network that
# failed), or answered that it is at its connection limit (for every client or for the role:
# the next connection that ends lets one in): try again later. Anything else it says at
# connecting is an answer, or a setting it cannot use (a bad port, an unknown URL parameter, an
# unparsable URL, no password to send): trying again changes nothing, so it is said at once.
_NOT_ANSWERED = (
    "connection refused", "timeout expired", "timed out", "no route to host", "network is unreachable",
    "host is unreachable", "temporary failure in name resolution", "connection reset", "server closed the connection",
    "could not receive data", "could not send data", "ssl syscall error", "the database system is",
)
# ... and, once the store was reached in this process (its name resolved then), a name that does not
# resolve now: a resolver or a DNS record that fails for a moment, as a network does. A name that
# never resolved is a setting that is wrong (a typo in the host): said at once.
_NOT_RESOLVED = ("failed to resolve host", "could not translate host name")
_AT_CAPACITY = ("too many clients already", "too many connections for", "remaining connection slots are reserved")
# ... of which, those that say only that nothing came back in time (`Unreachable.unheard`)
_UNHEARD = ("timeout expired", "timed out", "server closed the connection unexpectedly")


def _connect(url: str, timeout: float, autocommit: bool = False, reached: bool = False) -> Any:
    """A connection to `url`, or: `Unreachable` when the server did not answer (`_not_answered`;
    a name that does not resolve too, once the store was `reached` in this process), else
    `LeaseError`, in libpq's words without the password."""
    try:
        import psycopg
    except ImportError:
        raise LeaseError("a postgresql:// lease store needs psycopg: install the `postgres` extra "
                         "(`pip install '.[postgres]'` in a checkout) or `pip install 'psycopg[binary]'`") from None
    if (problem := url_problem(url)) is not None:  # (a store made by hand: the settings were checked)
        raise LeaseError(f"cannot connect: {problem}")
    try:
        # libpq's connect timeout is whole seconds (at least 2): rounded down, never past `timeout`
        return psycopg.connect(url, autocommit=autocommit, connect_timeout=max(2, int(timeout)))
    except psycopg.Error as exc:
        text = _first_line(exc, url)
        # libpq's "connection failed: connection to server at X failed: WHY": WHY first (a line
        # may be cut short), then where
        where = re.match(r"(?:connection failed: |connection is bad: )?(connection to server .*?) failed: (.+)$", text)
        text = f"{where[2]} ({where[1]})" if where else text
        if any(words in str(exc).lower() for words in _AT_CAPACITY):
            raise Unreachable(f"cannot connect: {text}", at_capacity=True) from None
        if _not_answered(str(exc), reached):
            unheard = isinstance(exc, psycopg.errors.ConnectionTimeout) or any(
                words in str(exc).lower() for words in _UNHEARD)
            raise Unreachable(f"cannot connect: {text}", unheard=unheard) from None
        raise LeaseError(f"cannot connect: {text}") from None
    except ValueError as exc:  # psycopg's own check of the URL (a `%FF` that decodes to no UTF-8): as bad a URL
        why = "the URL is not UTF-8 once percent-decoded: " if isinstance(exc, UnicodeError) else ""
        raise LeaseError(f"cannot connect: {why}{_first_line(exc, url)}") from None


def _said(exc: BaseException, url: str) -> str | None:
    """What `exc`, a store's failure to answer, tells a person of why (its first line, no
    password), or None when it says only that nothing came back in time (`Unreachable.unheard`,
    `_UNHEARD`: a timeout, or a socket that a statement's deadline shut). Pure."""
    if isinstance(exc, Unreachable) and exc.unheard:
        return None
    text = _first_line(exc, url)
    return None if any(words in text.lower() for words in _UNHEARD) else text


def _not_answered(message: str, reached: bool = False) -> bool:
    """libpq's `message` at connecting says the server did not answer (`_NOT_ANSWERED`; a Unix
    socket that is not there: the server is not running; a name that does not resolve, when the
    store was `reached` before in this process, `_NOT_RESOLVED`), not that it refused or that a
    setting is wrong. Pure."""
    lowered = message.lower()
    return (any(words in lowered for words in _NOT_ANSWERED + (_NOT_RESOLVED if reached else ()))
            or ("on socket" in lowered and "no such file or directory" in lowered))


def _encodings(conn: Any) -> tuple[str, str]:
    """The encoding of `conn`'s database (`LATIN1`) and the connection's (its `client_encoding`,
    the database's unless set otherwise), each `?` if it cannot be had."""
    def setting(name: str) -> str:
        try:
            value = conn.info.parameter_status(name)
        except Exception:
            return "?"
        return value if isinstance(value, str) and value else "?"
    return setting("server_encoding"), setting("client_encoding")


def _unencodable(exc: BaseException, names: dict[str, str], encodings: tuple[str, str]) -> str | None:
    """When `exc` says that a value could not be kept in the database's encoding (Python's codec
    could not encode a parameter in the connection's encoding, or the server could not convert
    it, `22P05`): which of `names` (a field's words to its value) holds a character it cannot,
    with that value (and the character), in one line. None for any other error. Pure."""
    server, client = encodings
    if isinstance(exc, UnicodeEncodeError):
        held = [(field, value) for field, value in names.items() if value == exc.object]
        if held:
            field, value = held[0]
            which = (f"the database's encoding, {server}," if client in (server, "?") else
                     f"the connection's client_encoding, {client},")  # (PGCLIENTENCODING, or the URL's)
            return (f"the {field} {value!r} has a character ({exc.object[exc.start:exc.end]!r}) that {which} cannot "
                    f"hold: use another {field}, or a database encoded in UTF8")
    elif getattr(exc, "sqlstate", None) != "22P05":
        return None
    # the server's refusal does not say which value: every one that is not ASCII
    fields = " or ".join(f"the {field} {value!r}" for field, value in names.items() if not value.isascii()) or "a name"
    return f"{fields} has a character that the database's encoding, {server}, cannot hold: use another, or a database encoded in UTF8"


def _first_line(exc: BaseException, url: str) -> str:
    """The first line of libpq's (or psycopg's) message `exc`, as every message shows it: with
    no form of `url`'s password (`masked`)."""
    return masked((str(exc).strip().splitlines() or [type(exc).__name__])[0], url)


def _user_end(rest: str) -> int:
    """Where the user part of a URL's `rest` (what follows `://`) ends, its `@` (-1: it has
    none): where libpq ends it, its first `@` before any `/`, or the last `@` before the query
    (`?`), whichever comes later. They are one `@` in a URL that `url_problem` lets through; in
    one it refuses (an `@`, `/` or `?` in a password, not percent-encoded), everything up to the
    later one is taken for the user part, so no piece of the password is shown as a host, port
    or database."""
    return max(_libpq_user_end(rest), rest.partition("?")[0].rfind("@"))


def _libpq_user_end(rest: str) -> int:
    """Where libpq ends the user part of a URL's `rest`: its first `@` before any `/` (-1: none)."""
    slash = rest.find("/")
    return rest.find("@", 0, len(rest) if slash < 0 else slash)


def url_problem(url: str) -> str | None:
    """What makes the `postgresql://` URL `url` read otherwise by libpq than as written, or None:
    libpq ends the user name and password at the URL's first `@`, looked for only before the
    first `/`, so an `@`, `/` or `?` in a password (or a user name) that is not percent-encoded
    makes part of it the host, the port or the database, and every message of libpq's would
    show that part. The URL, with its password masked, and how to write it. Pure."""
    rest = url.partition("://")[2]
    head = rest.partition("?")[0]
    if head.count("@") <= 1 and _libpq_user_end(rest) == head.rfind("@"):
        return None
    return (f"the URL {masked(url, url)!r} does not read as written: libpq ends its user name and password at "
            f"the first '@' (and looks for it only before the first '/'), so an '@', '/' or '?' in them must be "
            f"percent-encoded: '@' as %40, '/' as %2F, '?' as %3F")


def _redacted(url: str) -> str:
    """`url` without its password, in the user part (up to `_user_end`) or as a `password=`
    parameter (nothing is logged or shown with one)."""
    scheme, sep, rest = url.partition("://")
    rest = re.sub(r"(?i)([?&]password=)[^&]*", r"\1***", rest)  # first: an `@` of its value is no user part's
    end = _user_end(rest)
    credentials, place = rest[:max(end, 0)], rest[end + 1:]
    if end >= 0 and ":" in credentials:
        rest = f"{credentials.partition(':')[0]}:***@{place}"
    return scheme + sep + rest


def _passwords(url: str) -> set[str]:
    """Every form in which `url` gives a password: in its user part (up to `_user_end`, or up to
    the first `@`, as libpq reads it) or as `password=` parameters, each as written and percent-decoded."""
    rest = url.partition("://")[2]
    given = {credentials.partition(":")[2] for credentials in (rest.partition("@")[0], rest[:max(_user_end(rest), 0)])
             if "@" in rest and ":" in credentials}
    given.update(re.findall(r"(?i)[?&]password=([^&]*)", rest))
    forms = given | {urllib.parse.unquote(word) for word in given} | {urllib.parse.unquote_plus(word) for word in given}
    return {form for form in forms if form}


def masked(text: str, url: str) -> str:
    """`text` (a message that may quote libpq's words, which repeat what it could not parse)
    with no form of `url`'s password: `url` itself redacted (`_redacted`), then every form of
    the password (`_passwords`) that stands alone, not inside a longer word (a password `p` in
    "port" is not shown), as `***`. The one place a store's message loses its password."""
    text = text.replace(url, _redacted(url))
    for word in sorted(_passwords(url), key=len, reverse=True):
        text = re.sub(rf"(?<![A-Za-z0-9]){re.escape(word)}(?![A-Za-z0-9])", "***", text)
    return text


_KEYWORD_PASSWORD = re.compile(r"(?i)((?:^|\s)password\s*=\s*)(?:'(?:[^'\\]|\\.)*'?|\S+)")


def concealed(setting: str) -> str:
    """`setting` (what `--slots`, `$MPVISOR_SLOTS`, a file's `slots` or `leases=` was given) as
    an error shows it, whatever its form, with no password: `masked` for a URL; for text that is
    not one, a libpq keyword/value `password=...` (`host=db password=x`) and the user-info of a
    malformed URL (`postgresql//deploy:x@db/ops`, `postgres:/deploy:x@db`, its `?password=x`)
    as `***` too (`masked` knows a password only in a well-formed URL, and showed these whole)."""
    text = _KEYWORD_PASSWORD.sub(r"\1***", masked(setting, setting))
    text = re.sub(r"(?i)([?&]password=)[^&]*", r"\1***", text)
    head, at, tail = text.rpartition("@")
    colon = next((i for i, char in enumerate(head) if char == ":" and not head.startswith("/", i + 1)), None)
    return f"{head[:colon]}:***@{tail}" if at and colon is not None else text


def unreachable(exc: BaseException) -> bool:
    """`exc` says the store did not answer (try again later), not that it refused."""
    if isinstance(exc, Unreachable):
        return True
    try:
        import psycopg
    except ImportError:
        return False
    sqlstate = getattr(exc, "sqlstate", None) or ""
    return isinstance(exc, psycopg.OperationalError) and (not sqlstate or sqlstate[:2] in ("08", "57"))


class _Deadline:
    """A statement on `conn` that has not returned within `seconds` has its socket shut down,
    so that it fails (the connection broken) instead of waiting forever for a server cut off by
    a silent network: libpq has no client-side timeout of its own."""

    def __init__(self, conn: Any, seconds: float) -> None:
        self.conn, self.seconds = conn, seconds
        self.timer: threading.Timer | None = None
        self.cut = False  # it shut the socket: libpq's "server closed the connection" is then this doing

    def __enter__(self) -> None:
        self.timer = threading.Timer(self.seconds, self._cut)
        self.timer.daemon = True
        self.timer.start()

    def __exit__(self, *exc: object) -> None:
        if self.timer is not None:
            self.timer.cancel()

    def _cut(self) -> None:
        self.cut = True
        try:
            fd = self.conn.pgconn.socket
            with socket.socket(fileno=os.dup(fd)) as sock:
                sock.shutdown(socket.SHUT_RDWR)
        except Exception:
            pass  # already closed


class PostgresStore:
    """The `postgresql://` lease store (module docstring)."""

    def __init__(self, url: str, ttl: float = DEFAULT_LEASE_TTL) -> None:
        self.url = url
        self.ttl = ttl
        self.interval = ttl / 6  # looks of a waiting request at least this often
        self.renew_every = ttl * RENEW_EVERY  # an owner's renewals
        self.retry = retry_every(ttl)  # a statement the store did not answer is tried again this often
        # a statement (or a connect) not answered by then failed: a quarter TTL, from 2 s to 10 s (a
        # longer TTL must not make a drop wait minutes, or hours, for a silent store, nor a transaction
        # cut off mid-way hold its slot's row lock that long: the statements take milliseconds)
        self.op_timeout = min(max(MIN_OP_TIMEOUT, ttl / 4), MAX_OP_TIMEOUT)
        # ... and on the server's side: a transaction whose client stopped (paused, cut off) is
        # ended, so that its locks never hold up another host's (SET LOCAL: one transaction's
        # settings, as a transaction-pooling PgBouncer allows).
        ms = int(self.op_timeout * 1000)
        self.bounds = (f"SET LOCAL idle_in_transaction_session_timeout = {ms}; SET LOCAL lock_timeout = {ms}; "
                       f"SET LOCAL statement_timeout = {ms}")
        self.name = f"the lease store at {masked(url, url)}"
        self._ready = False
        # a connection was made in this process: a name that does not resolve now is a passing fault (`_NOT_RESOLVED`)
        self._reached = False
        self._lock = threading.Lock()
        self._warming: threading.Thread | None = None
        self._spare: Any = None  # the connection `warm` opened, until a request takes it
        self._unanswered: Exception | None = None  # why `warm` could not connect, until a request takes it
        self._closing = False  # `close_idle` was called: a connection `warm` opens after it is closed, not kept

    def __repr__(self) -> str:
        return f"<PostgresStore {masked(self.url, self.url)} ttl={self.ttl}>"

    def warm(self) -> None:
        """Open, on a thread, the connection the first request will use (psycopg's import, the
        connection and the schema's check take longer than a launcher's start): called as the
        supervisor starts, it overlaps them. A store not reachable now is tried again then, but
        the first request to come is told that it did not answer (`connect` raises it), rather
        than waiting for it as long again."""
        def open_spare() -> None:
            try:
                conn = self.connect()
            except Exception as exc:
                if unreachable(exc):
                    with self._lock:
                        self._unanswered = exc
                return
            with self._lock:
                closing = self._closing
                if not closing:
                    self._spare = conn
            if closing:
                conn.close()

        with self._lock:
            self._closing = False
        self._warming = threading.Thread(target=open_spare, name="mpvisor-lease-store-warm", daemon=True)
        self._warming.start()

    def close_idle(self) -> None:
        """The connection `warm` opened, if no request took it, is closed (now, or as `warm`'s
        thread opens it): the controller calls this as it ends, so that a program whose
        supervisor never ran a slotted task keeps no connection to the store. The store stays
        usable: a later request opens its own connection."""
        with self._lock:
            self._closing = True
            spare, self._spare = self._spare, None
        if spare is not None:
            spare.close()

    def connect(self, autocommit: bool = False) -> Any:
        """A connection to the store, its schema created (or checked) on first use (the one
        `warm` opened, if it is there and this is not a listener's; once, the `Unreachable` that
        `warm` met, if it met one)."""
        warming = self._warming
        if warming is not None and warming is not threading.current_thread():
            warming.join()
            with self._lock:
                spare, self._spare = self._spare, None
                unanswered, self._unanswered = (self._unanswered, None) if not autocommit else (None, self._unanswered)
            if unanswered is not None:
                raise unanswered
            if spare is not None and not autocommit and not spare.closed:
                return spare
            if spare is not None:
                spare.close()
        conn = _connect(self.url, self.op_timeout, autocommit, reached=self._reached)
        self._reached = True
        with self._lock:
            if not self._ready:
                try:
                    with _Deadline(conn, self.op_timeout):
                        self._ensure_schema(conn)
                except BaseException:
                    conn.close()
                    raise
                self._ready = True
        return conn

    def _ensure_schema(self, conn: Any) -> None:
        """The tables exist and are of this version: read the version (the common case: one
        statement), else create what is missing under a lock, then check it."""
        try:
            with conn.transaction():
                row = conn.execute("SELECT value FROM mpvisor_meta WHERE key = 'schema'").fetchone()
        except Exception as exc:
            if getattr(exc, "sqlstate", None) != "42P01":  # not "undefined table": a real failure
                raise
            row = None
        if row is not None and row[0] == str(SCHEMA_VERSION):
            return
        try:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(hashtext('mpvisor_schema'))")
                conn.execute(_SCHEMA)
                row = conn.execute("SELECT value FROM mpvisor_meta WHERE key = 'schema'").fetchone()
                if row is None:
                    conn.execute("INSERT INTO mpvisor_meta VALUES ('schema', %s)", (str(SCHEMA_VERSION),))
                elif row[0] != str(SCHEMA_VERSION):
                    raise _newer_schema(row[0])
        except Exception as exc:
            if getattr(exc, "sqlstate", None) != "42501":  # not "insufficient privilege"
                raise
            # the role may not create the tables: say that this is what was asked, and what to do
            raise LeaseError(f"cannot create mpvisor's tables (mpvisor_meta, mpvisor_slots, mpvisor_requests) in "
                             f"this database: {_first_line(exc, self.url)}; the first run creates them, so its role "
                             f"needs to be allowed to, or create them once with a role that is and grant this one "
                             f"the privileges docs/slots.md lists") from None

    def request(self) -> PostgresRequest:
        return PostgresRequest(self)

    def holdings(self, timeout: float) -> list[dict[str, Any]]:
        """Who holds what, read within `timeout` s in all (the connection too: libpq's own connect
        timeout is at least 2 s, per address; a store that refuses connections or is at its
        connection limit is tried again meanwhile), on a thread of its own that is left behind if the
        store does not answer. Only reads: a database without mpvisor's tables holds nothing
        (they are not created); a refusal (no privilege, a newer schema) is a `LeaseError`."""
        done: list[Any] = []
        tried: list[Unreachable] = []  # what the last try that got no connection met (one at most)

        def read() -> None:
            try:
                done.append(self._read_holdings(timeout, tried))
            except Exception as exc:  # whatever it was, one line, not a thread's traceback and a wait
                done.append(LeaseError(f"{self.name}: {_first_line(exc, self.url)}"))

        reader = threading.Thread(target=read, name="mpvisor-lease-holdings", daemon=True)
        reader.start()
        reader.join(timeout)
        if not done:  # (a try still under way: what the one before it met is said)
            raise LeaseError(self._no_connection_text(timeout, tried[-1] if tried else None))
        if isinstance(done[0], LeaseError):
            raise done[0]
        views: list[dict[str, Any]] = done[0]
        return views

    def _no_connection_text(self, timeout: float, exc: Unreachable | None) -> str:
        """A listing's words for a store that gave it no connection within `timeout` s, with what
        the last try met (`exc`; None: no try ended)."""
        if exc is None:
            return f"{self.name} did not answer within {timeout:g} s"
        done = "has let no connection in" if exc.at_capacity else "did not answer"
        said = "" if exc.unheard else f": {exc}"  # no libpq words for its own timeout, or a closed socket
        return f"{self.name} {done} within {timeout:g} s{said}"

    def _read_holdings(self, timeout: float, tried: list[Unreachable]) -> list[dict[str, Any]] | LeaseError:
        # A store that does not answer, or lets no connection in (at its connection limit, or
        # restarting), is tried again until `timeout` has passed, as a run waits for it (a short
        # `--wait` as often, in proportion); what the last try met is `tried`'s one item, which `holdings`
        # says if its wait ends first; a refusal is said at once
        deadline = time.monotonic() + timeout
        while True:
            try:
                conn = _connect(self.url, deadline - time.monotonic(), autocommit=True, reached=self._reached)
                break
            except Unreachable as exc:
                tried[:] = [exc]  # the last only (a day's `--wait` tries tens of thousands of times)
                left = deadline - time.monotonic()
                if left <= 0:
                    return LeaseError(self._no_connection_text(timeout, exc))
                time.sleep(min(self.retry, timeout / 8, left))
            except LeaseError as exc:  # named as every other message of the listing names it
                return LeaseError(f"{self.name}: {exc}")
        bound = _Deadline(conn, timeout)
        try:
            conn.execute(f"SET statement_timeout = {int(timeout * 1000)}")
            with bound:
                if conn.execute("SELECT to_regclass('mpvisor_requests') IS NULL").fetchone()[0]:
                    return []  # no mpvisor's tables here: nothing is held
                version = conn.execute("SELECT value FROM mpvisor_meta WHERE key = 'schema'").fetchone()
                if version is not None and version[0] != str(SCHEMA_VERSION):
                    return LeaseError(f"{self.name}: {_newer_schema(version[0])}")  # named, as a run's line names it
                # as admission sees it: a waiter known to be dead (`_DEAD`) is skipped, so not shown
                rows = conn.execute(
                    f"SELECT slot, state, name, host, pid, extract(epoch FROM since), token, revoke FROM mpvisor_requests r "
                    f"WHERE expires > now() AND (state = 'granted' OR state = 'queued' AND NOT ({_DEAD})) "
                    f"ORDER BY slot, state DESC, position").fetchall()
        except Exception as exc:  # not answered in time, the connection lost, or refused (no privilege)
            if bound.cut:  # its socket shut by the deadline: libpq's "server closed the connection" would mislead
                return LeaseError(f"{self.name} did not answer within {timeout:g} s")
            if unreachable(exc):
                return LeaseError(f"{self.name} did not answer: {_first_line(exc, self.url)}")
            return LeaseError(f"{self.name}: {_first_line(exc, self.url)}")
        finally:
            conn.close()
        views: dict[str, dict[str, Any]] = {}
        try:
            checked = [_checked_row(row) for row in rows]
        except LeaseError as exc:
            return LeaseError(f"{self.name}: {exc}")
        for slot, state, name, host, pid, since, token, revoke in checked:
            view = views.setdefault(slot, {"slot": slot, "status": "admitting", "owner": None, "queue": []})
            if state == "granted":
                view["owner"] = {"pid": pid, "name": name, "host": host, "since": since, "token": token}
                view["status"] = "terminating" if revoke else "running"
            else:
                view["queue"].append({"pid": pid, "name": name, "host": host})
        return list(views.values())

    # --- the slot's transaction ---------------------------------------------------------------------

    def step(self, conn: Any, slot: str) -> bool:
        """In the slot's locked transaction: drop expired rows; grant the head if nobody owns the
        slot. Whether it changed anything (the slot's listeners are then told)."""
        expired = conn.execute("DELETE FROM mpvisor_requests WHERE slot = %s AND expires <= now()", (slot,)).rowcount
        owner = conn.execute("SELECT 1 FROM mpvisor_requests WHERE slot = %s AND state = 'granted'", (slot,)).fetchone()
        if owner is not None:
            return bool(expired)
        head = conn.execute(f"SELECT id, {_UNKNOWN} FROM mpvisor_requests r WHERE slot = %s AND state = 'queued' "
                            f"AND NOT ({_DEAD}) ORDER BY position LIMIT 1", (slot,)).fetchone()
        if head is None or head[1]:  # nobody, or a head not yet known to be alive or dead (`_UNKNOWN`)
            return bool(expired)
        (token,) = conn.execute("UPDATE mpvisor_slots SET last_token = last_token + 1 WHERE slot = %s "
                                "RETURNING last_token", (slot,)).fetchone()
        # Its expiry stays its own (its host's TTL, from its last renewal), not this host's.
        conn.execute("UPDATE mpvisor_requests SET state = 'granted', token = %s, since = now() WHERE id = %s",
                     (token, head[0]))
        return True

    def lock(self, conn: Any, slot: str) -> None:
        conn.execute("INSERT INTO mpvisor_slots (slot) VALUES (%s) ON CONFLICT DO NOTHING", (slot,))
        conn.execute("SELECT 1 FROM mpvisor_slots WHERE slot = %s FOR UPDATE", (slot,))


def _on_boot_clock(monotonic: float) -> float:
    """`monotonic`, a `time.monotonic()` of a moment ago, on the clock that also counts the time a
    suspended host slept (`CLOCK_BOOTTIME`; Linux's monotonic clock stops then): a lease that
    expired while its host slept is not taken for one freed before its expiry."""
    return time.clock_gettime(time.CLOCK_BOOTTIME) - (time.monotonic() - monotonic)


def _newer_schema(version: str) -> LeaseError:
    return LeaseError(f"the lease store's schema is version {version!r}; this mpvisor reads version {SCHEMA_VERSION}")


def _checked_row(row: Any) -> tuple[str, str, str, str, int, float, int | None, bool]:
    """A row of `mpvisor_requests` as `holdings` shows it, or `LeaseError` naming what is wrong
    (the table was written by something else than mpvisor)."""
    slot, state, name, host, pid, since, token, revoke = row
    if state not in ("queued", "granted") or not isinstance(pid, int) or (state == "granted" and not isinstance(token, int)):
        raise LeaseError(f"the lease store's table mpvisor_requests holds a row mpvisor did not write: "
                         f"slot={slot!r} state={state!r} pid={pid!r} token={token!r}")
    return slot, state, name, host, pid, float(since or 0), token, bool(revoke)


class PostgresRequest:
    """One owner's request in a `PostgresStore` (a `LeaseRequest`)."""

    def __init__(self, store: PostgresStore) -> None:
        self.store = store
        self.conn: Any = None  # opened by `acquire` (which waits while the store is unreachable)
        self.id: int | None = None
        self.slot = ""
        self._lock = threading.Lock()  # one statement at a time on the connection
        self._closed = threading.Event()
        self._withdrawn = False
        self._submitting = False  # a submission's statements are under way (`_submit`): its row may be written
        self._held = False
        # when the last transaction that renewed the granted lease began (the look that saw the grant,
        # then each renewal), on the clock that also counts a suspended host's sleep (`_on_boot_clock`):
        # its row's expiry is at least a TTL past it
        self._renewed = 0.0
        self._listener: Any = None  # the waiting thread's LISTEN connection (closed by `close`)
        self._told_silent = False  # `on_silent` is called once per request
        # the request id whose liveness lock the listener holds (`_listening`): a request submitted
        # again (its row expired) has a new id, and must hold the new id's lock, or it looks dead
        self._alive_id: int | None = None
        self._unanswered: Exception | None = None  # `prepare` could not connect: the store did not answer
        self._unanswered_since: float | None = None  # when that try began (the silence counts from it)

    def __repr__(self) -> str:
        return f"<PostgresRequest {self.id} slot={self.slot!r} held={self._held}>"

    def _in_slot(self, work: Callable[[], Any], changes: bool = True) -> tuple[float, Any]:
        """`work()` in the slot's locked transaction, then a step of the slot; the slot's
        listeners are notified when the work `changes` the slot (a look does not) or the step did.
        As `_transaction`: when the transaction that got through began, and the work's result."""
        def in_slot() -> Any:
            self.store.lock(self.conn, self.slot)
            result = work()
            if self.store.step(self.conn, self.slot) or changes:
                self.conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, self.slot))
            return result
        return self._transaction(in_slot)

    def prepare(self) -> None:
        """Connect ahead of `acquire` (psycopg's import, the connection, the schema's check), as
        the launcher starts; a store not reachable now is tried again by `acquire`, not by another
        `prepare` (the driver's `acquire` calls it again: a second wait on a silent store)."""
        with self._lock:
            if self.conn is None and not self._closed.is_set() and self._unanswered is None:
                tried = time.monotonic()
                try:
                    self._connected()
                except Exception as exc:
                    self._unanswered = exc if unreachable(exc) else None
                    self._unanswered_since = tried if self._unanswered is not None else None

    def _transaction(self, work: Callable[[], Any]) -> tuple[float, Any]:
        """`work()` in one transaction on this request's connection, within the store's
        `op_timeout`; the `time.monotonic()` before that transaction began (its `now()`, which a
        renewal's expiry counts from, is later), and the work's result. A connection the server
        closed (it restarted, `pg_terminate_backend`, or a statement timed out) is opened again
        and the work tried once more: nothing of the failed transaction was committed. A request
        closed (`close`) opens none: its renewing thread, woken by its own release's
        notification, would otherwise connect again once `close` closed the connection, and
        leave that one open for as long as the process lives."""
        with self._lock:
            for last in (False, True):
                if self.conn is None or self.conn.broken or self.conn.closed:
                    self._connected()
                began = time.monotonic()
                try:
                    with _Deadline(self.conn, self.store.op_timeout), self.conn.transaction():
                        self.conn.execute(self.store.bounds)
                        return began, work()
                except Exception:
                    if last or self._closed.is_set() or not (self.conn.broken or self.conn.closed):
                        raise
        raise AssertionError("the second try returns or raises")

    def _connected(self, listener: bool = False) -> Any:
        """A new connection, kept as this request's (its listener's, if `listener`), unless the
        request was closed meanwhile: then it is closed at once and `_Withdrawn` raised. (`close`
        sets `_closed` before it reads the request's connections, and this keeps the connection
        before it looks at `_closed`: one of the two closes it.)"""
        conn = self.store.connect(autocommit=listener)
        if listener:
            self._listener = conn
        else:
            self.conn = conn
        if self._closed.is_set():
            conn.close()
            raise _Withdrawn()
        return conn

    def _patiently(self, work: Callable[[], Any], on_silent: OnSilent | None) -> Any:
        """`work()` until the store answers it: while it is unreachable, tries again (every
        `retry`), until the request is withdrawn (`_Withdrawn`); once it has not answered for
        `SILENT_AFTER` s (counted from the first try it did not answer, `prepare`'s included),
        `on_silent(why, full)`, once per request, before it tries again (`why`: what the last try
        met, `_said`; `full`: the server is at its connection limit). (Counted from this call's own first try, the
        line came a whole try later than that, or never under a short `--wait-timeout`.)"""
        silent_since, last = self._unanswered_since, self._unanswered
        self._unanswered_since = None  # `prepare`'s silence is counted once
        while True:
            if self._closed.is_set() or self._withdrawn:
                raise _Withdrawn()
            if silent_since is not None and last is not None:
                self._tell_silent(silent_since, last, on_silent)
            tried = time.monotonic()
            try:
                return work()
            except Exception as exc:
                if self._closed.is_set() or self._withdrawn:
                    raise _Withdrawn() from None
                if not unreachable(exc):
                    raise
                silent_since, last = (tried if silent_since is None else silent_since), exc
                self._tell_silent(silent_since, exc, on_silent)
                self._closed.wait(self.store.retry)

    def _tell_silent(self, since: float, exc: Exception, on_silent: OnSilent | None) -> None:
        if not self._told_silent and on_silent is not None and time.monotonic() - since >= SILENT_AFTER:
            self._told_silent = True
            if isinstance(exc, Unreachable) and exc.at_capacity:
                on_silent(str(exc), full=True)
            else:
                on_silent(_said(exc, self.store.url))

    def acquire(self, slot: str, policy: Policy, name: str, pids: list[Pid],
                on_queued: Callable[[int, dict[str, Any] | None], None] | None = None,
                on_silent: OnSilent | None = None) -> Decision:
        self.slot = slot
        pid = pids[0].pid if pids else os.getpid()
        def submit(as_policy: Policy) -> Callable[[], Decision | None]:
            def submitted() -> Decision | None:
                refused: Decision | None = self._patiently(
                    lambda: self._in_slot(lambda: self._submit(as_policy, name, pid))[1], on_silent)
                return refused
            return submitted

        try:
            if policy == "drop":  # never waits, not even for a store that does not answer: a run
                try:             # from cron must not pile up behind an outage (nothing runs: as busy)
                    if self.conn is None and self._unanswered is not None:  # `prepare`'s try counts: a
                        raise self._unanswered                               # drop waits for no second one
                    refused: Decision | None = self._in_slot(lambda: self._submit(policy, name, pid))[1]
                except Exception as exc:
                    if self._closed.is_set() or self._withdrawn or not unreachable(exc):
                        raise
                    unheard = "has let no connection in" if isinstance(exc, Unreachable) and exc.at_capacity else "did not answer"
                    return Decision(False, "slot_busy", reason=f"slot {slot!r}: {self.store.name} {unheard} "
                                                               f"({_first_line(exc, self.store.url)}); a drop does not wait")
            else:
                refused = submit(policy)()
            if refused is not None:
                return refused
            # A request whose row expired while it waited (cut off, paused past its grant) is
            # submitted again as a queued one, whatever its policy: a replace that expired unused
            # must not retire, or supersede, the runs that came after it and own the slot by now.
            return self._wait(on_queued, on_silent, submit("queue"))
        except Exception as exc:
            if self._closed.is_set() or self._withdrawn:  # `withdraw` or `close` crossed a statement
                return Decision(False, "withdrawn")
            if isinstance(exc, LeaseError):
                raise
            names = {"slot name": slot, "task name": name, "host name": socket.gethostname()}
            unheld = _unencodable(exc, names, _encodings(self.conn))  # which name, not Python's codec words
            raise LeaseError(unheld or _first_line(exc, self.store.url)) from None  # psycopg's words, no password

    def _submit(self, policy: Policy, name: str, pid: int) -> Decision | None:
        # Said before the look at `_withdrawn`, both read the other way round by `withdraw`: it
        # either sees this submission under way (and waits for its transaction), or it was
        # withdrawn before the look, and nothing is submitted.
        self._submitting = True
        try:
            if self._withdrawn:
                raise _Withdrawn()
            return self._submitted(policy, name, pid)
        finally:
            self._submitting = False  # a row it wrote has its id in `self.id` by now

    def _submitted(self, policy: Policy, name: str, pid: int) -> Decision | None:
        conn, slot, ttl = self.conn, self.slot, self.store.ttl
        conn.execute("DELETE FROM mpvisor_requests WHERE slot = %s AND expires <= now()", (slot,))
        # ... and expired rows of other slots (a release that failed in an outage, a dead waiter
        # superseded), which would stay until their slot is used again: an expired row can never
        # be renewed, so deleting it is safe; rows another transaction holds are left for later
        conn.execute("DELETE FROM mpvisor_requests WHERE id IN (SELECT id FROM mpvisor_requests WHERE expires <= now() "
                     "LIMIT 100 FOR UPDATE SKIP LOCKED)")
        # the owner, and the queued whose waiters are not known to be dead (`step` skips those)
        live = conn.execute(f"SELECT id, state, position FROM mpvisor_requests r WHERE slot = %s AND (state = 'granted' "
                            f"OR state = 'queued' AND NOT ({_DEAD})) ORDER BY position", (slot,)).fetchall()
        owner = [row for row in live if row[1] == "granted"]
        queued = [row for row in live if row[1] == "queued"]
        if policy == "drop" and live:
            return Decision(False, "slot_busy")
        if policy == "queue" and len(queued) >= MAX_QUEUE:
            return Decision(False, "queue_full")
        (position,) = conn.execute("SELECT nextval('mpvisor_positions')").fetchone()
        if policy == "replace":
            if queued:
                position = queued[0][2] - 1
                conn.execute("UPDATE mpvisor_requests SET state = 'superseded' WHERE id = %s", (queued[0][0],))
            if owner:
                conn.execute("UPDATE mpvisor_requests SET revoke = true WHERE id = %s", (owner[0][0],))
        (self.id,) = conn.execute(
            "INSERT INTO mpvisor_requests (slot, name, host, pid, state, position, expires) VALUES "
            "(%s, %s, %s, %s, 'queued', %s, now() + make_interval(secs => %s)) RETURNING id",
            (slot, name, socket.gethostname(), pid, position, ttl)).fetchone()
        return None

    def _wait(self, on_queued: Callable[[int, dict[str, Any] | None], None] | None,
              on_silent: OnSilent | None, again: Callable[[], Decision | None]) -> Decision:
        """Until this request is granted or refused: woken by the slot's notifications, and at
        least every `interval` (to renew its own row, and to see an owner's lease expire). While
        the store is unreachable it keeps waiting (`_patiently`); a request whose row expired
        meanwhile (cut off for longer than a TTL) is submitted `again`, at the end of the queue
        (as a `queue` request, even a replace: it retires nobody that came after it)."""
        listener: Any = None
        try:
            told = -1
            while True:
                # `renewed`: before the look that got through (and renewed a grant it saw), not before
                # the tries the store did not answer (a grant's fence counts from it)
                renewed, (state, position, owner, token) = self._patiently(self._look, on_silent)
                if self._withdrawn:
                    return Decision(False, "withdrawn")
                if state is None:  # expired while this host could not renew it: queue again
                    refused = again()
                    if refused is not None:
                        return refused
                    told = -1
                    continue
                if state == "granted":
                    self._held, self._renewed = True, _on_boot_clock(renewed)
                    return Decision(True, token=token, renewed=renewed, ttl=self.store.ttl)
                if state == "superseded":
                    self._delete()  # its row goes now, not when it expires
                    return Decision(False, "superseded_by_replace")
                if listener is None:  # listening from now on, then a look again: no release is missed
                    listener = self._patiently(functools.partial(self._listening, None, True), on_silent)
                    continue
                if position != told and on_queued is not None:
                    on_queued(position, owner)
                    told = position
                listener = self._patiently(functools.partial(self._listened, listener, None, True), on_silent)
        finally:
            if listener is not None:
                listener.close()

    def _look(self) -> tuple[float, tuple[str | None, int, dict[str, Any] | None, int | None]]:
        """When the look's transaction began, and this request's state, its place in the queue, the owner and its token, after a step
        of the slot (which grants the head once an owner's lease expired); its own row renewed
        (a row that expired is gone: `_wait` submits the request again). A queued row's `since`
        says when its waiter was last seen holding its liveness lock (NULL: not known to hold it;
        `PostgresStore.step` skips a waiter known to have died)."""
        def look() -> tuple[str | None, int, dict[str, Any] | None, int | None]:
            conn = self.conn
            conn.execute("UPDATE mpvisor_requests SET expires = now() + make_interval(secs => %s), since = CASE "
                         "WHEN state <> 'queued' THEN since WHEN %s THEN now() END WHERE id = %s AND expires > now()",
                         (self.store.ttl, self._alive_now(), self.id))
            row = conn.execute("SELECT state, position, token FROM mpvisor_requests WHERE id = %s AND expires > now()",
                               (self.id,)).fetchone()
            if row is None:
                return None, 0, None, None
            # ahead of it: the queued that admission does not skip (a waiter known to be dead is not)
            (ahead,) = conn.execute(f"SELECT count(*) FROM mpvisor_requests r WHERE slot = %s AND state = 'queued' "
                                    f"AND position < %s AND NOT ({_DEAD})", (self.slot, row[1])).fetchone()
            owner = conn.execute("SELECT name, pid, extract(epoch FROM since), host, token FROM mpvisor_requests "
                                 "WHERE slot = %s AND state = 'granted'", (self.slot,)).fetchone()
            seen = ({"name": owner[0], "pid": owner[1], "since": float(owner[2] or 0), "host": owner[3], "token": owner[4]}
                    if owner else None)
            return row[0], int(ahead) + 1, seen, row[2]
        result: tuple[float, tuple[str | None, int, dict[str, Any] | None, int | None]] = self._in_slot(look, changes=False)
        return result

    def watch(self, on_revoke: Callable[[], None], on_renewed: Callable[[float, float], None] | None = None,
              on_lost: Callable[[str | None], None] | None = None,
              on_unrenewed: Callable[[str], None] | None = None) -> None:
        threading.Thread(target=self._renew, args=(on_revoke, on_renewed, on_lost, on_unrenewed),
                         name="mpvisor-lease-renew", daemon=True).start()

    def _renew(self, on_revoke: Callable[[], None], on_renewed: Callable[[float, float], None] | None,
               on_lost: Callable[[str | None], None] | None, on_unrenewed: Callable[[str], None] | None) -> None:
        """While held: move the expiry every `renew_every`, and at once when the slot's channel
        says something changed, each success told (`on_renewed`, with the time before the
        transaction that got through); while the store does not answer, try again every `retry`
        (`store.py`: the renewal margin); a revoke asked is told once; a lease found gone is lost
        (`on_lost`, then no more renewals: it cannot come back): expired (`why` None), or, when
        its row was gone before it could have expired (the renewal's answer came, suspended sleep counted, within a TTL of
        the last renewal's start, before which its expiry cannot be), deleted by someone else
        (the guide's `free.sql`), `FREED`. Only that owner's own release deletes a live row. A
        renewal that did not get through is told (`on_unrenewed`, what it met: `_said`, or that
        nothing came back in time), so that a lease lost for want of renewals can say why."""
        ttl = self.store.ttl
        revoked = False
        listener: Any = None
        try:
            while not self._closed.is_set():
                try:
                    renewed, row = self._transaction(lambda: self.conn.execute(
                        "UPDATE mpvisor_requests SET expires = now() + make_interval(secs => %s) WHERE id = %s "
                        "AND state = 'granted' AND expires > now() RETURNING revoke", (ttl, self.id)).fetchone())
                except Exception as exc:
                    if self._closed.is_set():
                        return
                    if on_unrenewed is not None:
                        on_unrenewed(_said(exc, self.store.url) or UNANSWERED)
                    self._closed.wait(self.store.retry)  # not reachable this time: the fence's deadline comes closer
                    continue
                if row is None:
                    if self._held and on_lost is not None:  # not a row this owner released itself
                        freed = time.clock_gettime(time.CLOCK_BOOTTIME) < self._renewed + ttl
                        on_lost(FREED if freed else None)
                    return
                self._renewed = _on_boot_clock(renewed)
                if on_renewed is not None:
                    on_renewed(renewed, ttl)
                if row[0] and not revoked:
                    revoked = True
                    on_revoke()
                try:
                    listener = self._listened(listener, self.store.renew_every)
                except Exception:
                    if listener is not None:
                        listener.close()
                    listener = None
                    self._closed.wait(self.store.retry)
        finally:
            if listener is not None:
                listener.close()

    def _listening(self, listener: Any, waiter: bool = False) -> Any:
        """`listener` if it still listens to the slots' channel, else a new listener; a
        `waiter`'s also holds the liveness lock of the request's current id (`_ALIVE`: a session
        advisory lock, which the server drops with the session when the waiting process dies),
        moved to the new id when the request was submitted again. A store that cannot be
        reached raises."""
        if listener is None or listener.broken or listener.closed:
            if listener is not None:
                listener.close()
            self._alive_id = None
            listener = self._connected(listener=True)
            with _Deadline(listener, self.store.op_timeout):
                listener.execute(f"LISTEN {CHANNEL}")
        if waiter and self.id is not None and self._alive_id != self.id:
            with _Deadline(listener, self.store.op_timeout):
                if self._alive_id is not None:  # the lock of a row that expired and was submitted again
                    listener.execute(f"SELECT pg_advisory_unlock({_ALIVE_CLASS}, mod(%s, {_ALIVE_MOD})::int)",
                                     (self._alive_id,))
                    self._alive_id = None
                (alive,) = listener.execute(f"SELECT pg_try_advisory_lock({_ALIVE_CLASS}, mod(%s, {_ALIVE_MOD})::int)",
                                            (self.id,)).fetchone()
            self._alive_id = self.id if alive else None
        return listener

    def _alive_now(self) -> bool:
        """This waiter's listener holds the liveness lock of its current id, as far as this side knows."""
        listener = self._listener
        return (self.id is not None and self._alive_id == self.id and listener is not None
                and not listener.broken and not listener.closed)

    def _listened(self, listener: Any, timeout: float | None = None, waiter: bool = False) -> Any:
        """Wait for a notification about this request's slot, at most `timeout` (else `interval`); the listener
        to use next (a new one if there was none or the server closed it: the caller's next look
        sees what it missed). A store that cannot be reached raises."""
        listener = self._listening(listener, waiter)
        try:
            for notify in listener.notifies(timeout=self.store.interval if timeout is None else timeout):
                if notify.payload == self.slot:
                    break
            return listener
        except Exception:
            if self._closed.is_set():
                raise
            listener.close()
            return None

    def add_pids(self, pids: list[Pid]) -> None:
        pass  # a lease here is held by its renewals (a dead owner's expires), not by pids

    def withdraw(self) -> None:
        """Leave the queue: the request's row is deleted (a pending `acquire` returns
        `withdrawn`). `LeaseError` if the store did not take that within `WITHDRAW_WAIT` s (it
        did not answer, or refused): the row then stays until it expires, within a TTL (it was
        renewed at its last look), and says so. (The deletion goes on behind, on a thread of its
        own: a statement the store stalls on holds up nobody.) A request closed already asks
        nothing (`close`: its connections are gone). A submission on its way (its transaction
        begun, its row's id not back yet) is waited for, and the row it wrote deleted: once
        withdrawn, a request's next transaction submits nothing (`_submit`)."""
        self._withdrawn = True
        if self._closed.is_set() or (self.id is None and not self._submitting):
            return  # closed, or nothing in the queue and no submission under way to put it there
        failed: list[Exception] = []

        def delete() -> None:
            try:
                with self._lock:  # after the transaction under way, if any: its row's id is known then
                    submitted = self.id
                if submitted is not None:
                    self._in_slot(lambda: self.conn.execute("DELETE FROM mpvisor_requests WHERE id = %s", (submitted,)))
            except Exception as exc:
                failed.append(exc)

        deleting = threading.Thread(target=delete, name="mpvisor-lease-withdraw", daemon=True)
        deleting.start()
        deleting.join(WITHDRAW_WAIT)
        if not deleting.is_alive() and not failed:
            return
        why = (f"no answer within {WITHDRAW_WAIT:g} s" if deleting.is_alive()
               else "the request was closed first" if isinstance(failed[0], _Withdrawn)
               else _first_line(failed[0], self.store.url))
        raise LeaseError(f"{why}; its place lapses within its lease TTL ({self.store.ttl:g} s)")

    def release(self) -> None:
        """Delete this request's row. A store that does not answer is tried again (every
        `retry`) until it does, the request is closed, or the row would have expired anyway (a
        TTL from now at the latest): a release the store missed for a moment (a restart as the
        owner ended) frees the slot once the store is back, not a TTL later. (The driver waits
        `RELEASE_WAIT` for it, on a thread of its own, and says so when that was not enough.)"""
        self._held = False
        if self.id is None:
            return
        give_up = time.monotonic() + self.store.ttl
        while not self._delete() and not self._closed.is_set() and time.monotonic() < give_up:
            self._closed.wait(self.store.retry)

    def _delete(self) -> bool:
        """Delete this request's row, once; False when the store did not answer (the row then
        expires by itself), True when it did (or refused: trying again would change nothing)."""
        try:
            self._in_slot(lambda: self.conn.execute("DELETE FROM mpvisor_requests WHERE id = %s", (self.id,)))
        except Exception as exc:
            return not unreachable(exc)
        return True

    def close(self) -> None:
        self._closed.set()
        for conn in (self.conn, self._listener):  # a thread blocked on either returns
            try:
                if conn is not None:
                    conn.close()
            except Exception:
                pass


class _Withdrawn(Exception):
    """The request was withdrawn (or closed) while it waited for the store."""
