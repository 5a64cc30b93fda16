"""The mcp-outbox upstream contract (schema/README.md) for a Python tool server.

`mcp-outbox proxy` records each side-effecting tools/call before forwarding it
and hands the upstream a claim in ``_meta["io.github.mcp-outbox/claim"]``. A
cooperating upstream then writes the call's business rows, its outbox effects
and its outcome in one transaction of its own, fenced by the claim's owner.
This module is that transaction, written once, for either store the proxy
runs on: an SQLite file (the standard library's ``sqlite3``) or a PostgreSQL
database named by a postgres:// URL (psycopg 3, imported only then)::

    from mcp_outbox_upstream import Effect, ToolFailure, Upstream, text_result

    up = Upstream(os.environ["MCP_OUTBOX_DB"])  # a path or a postgres:// URL

    def charge(meta, customer, cents):          # meta: the request's _meta as a dict
        def work(tx, call_id, now_ms):           # runs inside the transaction
            if cents <= 0:
                raise ToolFailure("amount out of range")   # recorded as 'failed'
            charge_id = tx.execute("INSERT INTO charges ... RETURNING id", (...)).fetchone()[0]
            return (text_result(f"charged {customer}", {"chargeId": charge_id}),
                    [Effect("payments", "/v1/charges", body=b"...")])
        return up.run_call(meta, work)          # the result to answer, as recorded

What run_call guarantees:
  - one transaction (``BEGIN IMMEDIATE`` on SQLite; ``BEGIN`` at READ
    COMMITTED with the call's row locked by the fence on PostgreSQL): the
    fence check first, then work's
    writes (in a savepoint), its effects (idempotency keys ``<callId>-<n>``)
    and, for a claimed call, the outcome UPDATE, whose row count is checked;
  - a call without a claim gets a fresh call id (``call_`` + 24 hex digits)
    and effects with ``call_id`` NULL;
  - a lost claim (another attempt owns the call) rolls everything back and
    answers the tool error "claim lost: ...";
  - a ToolFailure raised by work rolls back work's writes and records the
    call as 'failed' with the tool error as its result; any other exception
    rolls back everything and propagates (the claim stays in_flight);
  - the result is recorded as JSON exactly as answered, without ``_meta``.

Both drivers are used synchronously: run_call never yields to an event loop,
so an asyncio/anyio handler cannot be cancelled half-way through a
transaction. Do slow work (waiting, network) before calling it, never inside
work: SQLite has one writer, and the proxy's claims wait for yours; on
PostgreSQL the call's row stays locked from the fence to the commit. While it
waits for the write lock (SQLite's busy_timeout) or the row lock
(PostgreSQL's lock_timeout), 5 s by default, it blocks the event loop, as a
synchronous driver must.

work's SQL is the store's own: ``?`` placeholders on SQLite, ``%s`` (psycopg)
on PostgreSQL; ``Upstream.dialect`` says which. ``INSERT ... RETURNING id``
works on both (SQLite 3.35 and later).
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CLAIM_META",
    "POSTGRES",
    "SQLITE",
    "Claim",
    "ClaimLost",
    "Effect",
    "SetupError",
    "ToolFailure",
    "Tx",
    "Upstream",
    "is_postgres_url",
    "new_call_id",
    "read_claim",
    "text_result",
]

# The _meta entry the proxy puts on a tools/call it has recorded.
CLAIM_META = "io.github.mcp-outbox/claim"

# The dialects: Upstream.dialect is one of them.
SQLITE = "sqlite"
POSTGRES = "postgres"

# The fence, checked first: is the claim still ours? BEGIN IMMEDIATE holds
# the write lock, so no one can take the call over until the commit; checking
# first means a stale attempt does no work at all.
_FENCE_SQLITE = "SELECT 1 FROM calls WHERE id = ? AND owner = ? AND state = 'in_flight'"
# On PostgreSQL the fence also locks the call's row until the commit (FOR
# UPDATE), which is what BEGIN IMMEDIATE's write lock gives on SQLite: no
# other attempt can take the call over meanwhile. At READ COMMITTED a row
# another transaction is changing is waited for, and the WHERE is checked
# again on what that transaction committed. And an owner whose lease has
# passed no longer holds the claim (another proxy may be about to take the
# call over), as the proxy's own fence has it: lease_until is in the
# proxy's clock, so the clocks must agree to well within a lease.
_FENCE_POSTGRES = """SELECT 1 FROM calls
                     WHERE id = %s AND owner = %s AND state = 'in_flight' AND lease_until > %s
                     FOR UPDATE"""
# The outcome, written last (the result usually depends on the business
# rows), under the same condition; its row count is the fence that matters.
_SETTLE_SQLITE = """UPDATE calls SET state = ?, result = ?, completed_at = ?, owner = '', lease_until = 0
                    WHERE id = ? AND owner = ? AND state = 'in_flight'"""
_SETTLE_POSTGRES = """UPDATE calls SET state = %s, result = %s, completed_at = %s, owner = '', lease_until = 0
                      WHERE id = %s AND owner = %s AND state = 'in_flight'"""
_INSERT_EFFECT_SQLITE = """INSERT INTO effects (call_id, seq, destination, method, path, headers, body,
                                                idempotency_key, next_attempt_at, created_at, updated_at)
                           VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"""
_INSERT_EFFECT_POSTGRES = """INSERT INTO effects (call_id, seq, destination, method, path, headers, body,
                                                  idempotency_key, next_attempt_at, created_at, updated_at)
                             VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"""
# Does the database hold the outbox tables (the proxy's)?
_HAS_TABLES_SQLITE = "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN ('calls', 'effects')"
_HAS_TABLES_POSTGRES = """SELECT count(*) FROM pg_catalog.pg_tables
                          WHERE schemaname = current_schema() AND tablename IN ('calls', 'effects')"""


@dataclass(frozen=True)
class _Statements:
    begin: str
    fence: str
    settle: str
    insert_effect: str


_STATEMENTS = {
    SQLITE: _Statements("BEGIN IMMEDIATE", _FENCE_SQLITE, _SETTLE_SQLITE, _INSERT_EFFECT_SQLITE),
    # READ COMMITTED is enough: the fence's row lock and the outcome's
    # compare-and-set decide who commits. Named, so that a server whose
    # default_transaction_isolation is stricter does not turn a takeover
    # racing the fence into a serialization failure.
    POSTGRES: _Statements(
        "BEGIN ISOLATION LEVEL READ COMMITTED", _FENCE_POSTGRES, _SETTLE_POSTGRES, _INSERT_EFFECT_POSTGRES
    ),
}


def is_postgres_url(target: str) -> bool:
    """Whether target names a PostgreSQL database rather than an SQLite file,
    as the proxy's --db tells them apart."""
    return target.startswith(("postgres://", "postgresql://"))


class SetupError(Exception):
    """The database is not ready for an upstream: no outbox tables, or an
    SQLite file not in WAL mode."""


class ToolFailure(Exception):
    """A tool error that is the call's outcome: raised by work, its message is
    the error text answered and recorded (state 'failed'); work's writes are
    rolled back and it enqueues no effects."""


class ClaimLost(Exception):
    """The fence failed: another attempt owns the call now. run_call answers it
    as a tool error; nothing of the call was written."""

    def __init__(self, claim: Claim):
        super().__init__(
            f"claim lost: call {claim.call_id} (row {claim.row_id}) is no longer in flight under owner "
            f"{json.dumps(claim.owner)}; another attempt took it over. Nothing was written."
        )


@dataclass(frozen=True)
class Claim:
    """The proxy's claim on a call: calls.key, calls.uid, calls.id, calls.owner."""

    key: str
    call_id: str
    row_id: int
    owner: str


@dataclass(frozen=True)
class Effect:
    """A request for the dispatcher to send once the call has committed.

    destination names one the proxy is configured with (its base URL is the
    proxy's); path starts with "/". headers are stored: no secrets, and never
    Idempotency-Key (the dispatcher sends the effect's own). A str body is
    stored as its UTF-8 bytes.
    """

    destination: str
    path: str
    method: str = "POST"
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes | str | None = None


class Tx:
    """What work gets of the transaction: statements, nothing that ends it.
    Do not BEGIN, COMMIT or ROLLBACK through it.

    execute returns the driver's cursor (sqlite3's or psycopg's): fetchone,
    fetchall and rowcount work on both; lastrowid only on SQLite, so use
    RETURNING. On PostgreSQL a statement that fails aborts the transaction
    up to work's savepoint: let the error propagate (everything rolls back),
    or raise ToolFailure (work's writes roll back and the failure is
    recorded); statements after a caught error fail."""

    __slots__ = ("_conn", "dialect")

    def __init__(self, conn: Any, dialect: str):
        self._conn = conn
        self.dialect = dialect

    def execute(self, sql: str, params: Sequence[Any] | Mapping[str, Any] | None = None) -> Any:
        if self.dialect == POSTGRES:
            # None, not (): with parameters psycopg reads % in sql as a
            # placeholder, without them as itself.
            return self._conn.execute(sql, params)
        return self._conn.execute(sql, () if params is None else params)

    def executemany(self, sql: str, seq_of_params: Any) -> Any:
        if self.dialect == POSTGRES:
            cur = self._conn.cursor()
            cur.executemany(sql, seq_of_params)
            return cur
        return self._conn.executemany(sql, seq_of_params)


Work = Callable[[Tx, str, int], "tuple[dict[str, Any], Sequence[Effect]]"]


def new_call_id() -> str:
    """A fresh call id for a call without a claim: "call_" + 24 hex digits."""
    return "call_" + secrets.token_hex(12)


def text_result(text: str, structured: Mapping[str, Any] | None = None, is_error: bool = False) -> dict[str, Any]:
    """A tools/call result with one text block, as a JSON-ready dict."""
    r: dict[str, Any] = {"content": [{"type": "text", "text": text}]}
    if structured is not None:
        r["structuredContent"] = dict(structured)
    r["isError"] = is_error
    return r


def _is_int(v: Any) -> bool:
    # bool is a subclass of int: True must not pass for a row id.
    return isinstance(v, int) and not isinstance(v, bool)


def read_claim(meta: Mapping[str, Any] | None) -> Claim | None:
    """The claim in a request's _meta (a dict), or None. A malformed entry is
    a ValueError: answering it as if unclaimed would run the call unfenced."""
    if not meta or CLAIM_META not in meta:
        return None
    c = meta[CLAIM_META]
    if (
        not isinstance(c, Mapping)
        or not isinstance(c.get("key"), str)
        or not isinstance(c.get("callId"), str)
        or c["callId"] == ""
        or not _is_int(c.get("rowId"))
        or not isinstance(c.get("owner"), str)
        or c["owner"] == ""
    ):
        raise ValueError(f"malformed {CLAIM_META} entry in _meta: {json.dumps(c, default=repr)}")
    return Claim(key=c["key"], call_id=c["callId"], row_id=c["rowId"], owner=c["owner"])


def _result_json(result: Mapping[str, Any]) -> str:
    # calls.result is the result without _meta. allow_nan=False: NaN and
    # Infinity are not JSON, and the proxy must be able to decode what it
    # replays. Compact, UTF-8 as is: what JSON.stringify would write.
    recorded = {k: v for k, v in result.items() if k != "_meta"}
    return json.dumps(recorded, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _check_effect(e: Any) -> Effect:
    if not isinstance(e, Effect):
        raise TypeError(f"an effect must be an Effect, not {type(e).__name__}")
    if not e.destination:
        raise ValueError("effect without a destination")
    if not e.path.startswith("/"):
        raise ValueError(f"effect path {e.path!r} does not start with /")
    if not e.method or e.method != e.method.upper():
        raise ValueError(f"effect method {e.method!r}: want upper case, e.g. POST")
    for k, v in e.headers.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError("effect headers map strings to strings")
        if k.lower() == "idempotency-key":
            raise ValueError("effect headers must not set Idempotency-Key: the dispatcher sends the effect's own")
    return e


class Upstream:
    """An upstream's connection to the database it shares with the proxy.

    target is what the proxy's --db names: an SQLite file, or a PostgreSQL
    database as a postgres:// (or postgresql://) URL, which psycopg 3 opens
    (libpq's URL: sslmode and the like as query parameters). The database
    must hold the outbox tables, an SQLite file must be in WAL mode: the
    proxy creates them and this never does (SetupError otherwise).
    cooperate=False ignores claims and writes business rows only, which is
    what an upstream that does not follow the contract does; it exists for
    tests. busy_timeout_ms bounds each wait for a lock: SQLite's
    busy_timeout, PostgreSQL's lock_timeout.

    conn is the driver's connection, for work outside run_call (creating
    your tables, plain reads). On PostgreSQL it is in autocommit mode: each
    statement outside run_call commits on its own. dialect is SQLITE or
    POSTGRES.

    Use it from one thread at a time: the event loop's.
    """

    def __init__(self, target: str, *, cooperate: bool = True, busy_timeout_ms: int = 5000):
        self.cooperate = cooperate
        if is_postgres_url(target):
            self.dialect = POSTGRES
            self.conn = _connect_postgres(target, busy_timeout_ms)
        else:
            self.dialect = SQLITE
            self.conn = _connect_sqlite(target, busy_timeout_ms)
        self._sql = _STATEMENTS[self.dialect]

    def close(self) -> None:
        self.conn.close()

    @property
    def in_transaction(self) -> bool:
        """Whether a transaction is open on conn (never, between run_calls)."""
        if self.dialect == POSTGRES:
            from psycopg.pq import TransactionStatus

            # Not UNKNOWN either: a broken connection has no transaction to
            # roll back.
            return self.conn.info.transaction_status in (TransactionStatus.INTRANS, TransactionStatus.INERROR)
        return self.conn.in_transaction

    def claim_of(self, meta: Mapping[str, Any] | None) -> Claim | None:
        """The claim this upstream honours for a request's _meta: none when not
        cooperating."""
        return read_claim(meta) if self.cooperate else None

    def run_call(self, meta: Mapping[str, Any] | None, work: Work) -> dict[str, Any]:
        """Runs one tool call in one transaction and returns the result to
        answer.

        meta is the request's _meta as a dict (None for none). work(tx,
        call_id, now_ms) runs inside the transaction and returns (result,
        effects): result a tools/call result as a dict (text_result), effects
        a sequence of Effect. It may raise ToolFailure.
        """
        claim = self.claim_of(meta)
        call_id = claim.call_id if claim else new_call_id()
        conn, sql = self.conn, self._sql
        conn.execute(sql.begin)
        try:
            if claim and not self._fence(claim):
                raise ClaimLost(claim)
            now = int(time.time() * 1000)
            # work's writes go in a savepoint, so that a ToolFailure undoes
            # them and keeps the transaction for the 'failed' outcome (on
            # PostgreSQL also after a statement of work failed, which aborts
            # the transaction up to the savepoint).
            conn.execute("SAVEPOINT mcp_outbox_work")
            try:
                result, effects = work(Tx(conn, self.dialect), call_id, now)
                effects = [_check_effect(e) for e in effects or ()]
                if not isinstance(result, Mapping) or "content" not in result:
                    raise TypeError("work must return a tools/call result (a dict with content), and effects")
            except ToolFailure as failure:
                conn.execute("ROLLBACK TO SAVEPOINT mcp_outbox_work")
                result, effects = text_result(str(failure), is_error=True), []
            conn.execute("RELEASE SAVEPOINT mcp_outbox_work")
            recorded = _result_json(result)
            if not self.cooperate:
                conn.execute("COMMIT")  # business rows only
                return _answer(recorded, result)
            for seq, e in enumerate(effects, start=1):
                body = e.body.encode() if isinstance(e.body, str) else e.body
                conn.execute(
                    sql.insert_effect,
                    (
                        claim.row_id if claim else None,
                        seq,
                        e.destination,
                        e.method,
                        e.path,
                        json.dumps(dict(e.headers), separators=(",", ":")),
                        body,
                        f"{call_id}-{seq}",
                        now,
                        now,
                        now,
                    ),
                )
            if claim:
                state = "failed" if result.get("isError") else "completed"
                cur = conn.execute(sql.settle, (state, recorded, now, claim.row_id, claim.owner))
                if cur.rowcount != 1:
                    raise ClaimLost(claim)
            conn.execute("COMMIT")
            return _answer(recorded, result)
        except ClaimLost as lost:
            self._rollback()
            return text_result(str(lost), is_error=True)
        except BaseException:
            # Also a failed COMMIT: the transaction is still open then on
            # SQLite (on PostgreSQL a failed COMMIT has ended it).
            self._rollback()
            raise

    def _fence(self, claim: Claim) -> bool:
        if self.dialect == POSTGRES:
            # The lease in milliseconds of this machine's clock, as the
            # proxy writes it in its own.
            args: tuple[Any, ...] = (claim.row_id, claim.owner, int(time.time() * 1000))
        else:
            args = (claim.row_id, claim.owner)
        return self.conn.execute(self._sql.fence, args).fetchone() is not None

    def _rollback(self) -> None:
        if self.in_transaction:
            self.conn.execute("ROLLBACK")


def _connect_sqlite(path: str, busy_timeout_ms: int) -> sqlite3.Connection:
    # sqlite3.connect creates a missing file; mode=rw in a URI refuses to,
    # so that a wrong path is an error rather than an empty database.
    uri = "file:" + urllib.request.pathname2url(os.path.abspath(path)) + "?mode=rw"
    # isolation_level=None: the module must not open transactions implicitly
    # (before DML, with plain BEGIN); run_call issues BEGIN IMMEDIATE itself.
    # The timeout is sqlite3's busy handler, in seconds.
    conn = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=busy_timeout_ms / 1000)
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        # FULL is SQLite's usual default, but a build may default WAL
        # databases to NORMAL (better-sqlite3 does): ask, so that a commit
        # survives a power loss like the proxy's.
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA foreign_keys = ON")
        (mode,) = conn.execute("PRAGMA journal_mode").fetchone()
        if str(mode).lower() != "wal":
            raise SetupError(f"{path} is not in WAL mode: start mcp-outbox proxy on it first")
        (n,) = conn.execute(_HAS_TABLES_SQLITE).fetchone()
        if n != 2:
            raise SetupError(f"{path} has no outbox tables (calls, effects): mcp-outbox proxy creates them; start it first")
    except BaseException:
        conn.close()
        raise
    return conn


def _connect_postgres(url: str, lock_timeout_ms: int) -> Any:
    # Imported here: an upstream on SQLite needs nothing beyond the
    # standard library.
    import psycopg

    # autocommit: psycopg must not open transactions implicitly (before the
    # first statement); run_call issues BEGIN itself, and a statement
    # outside run_call commits on its own. prepare_threshold=None: no
    # server-side prepared statements, which a transaction-mode pooler
    # (PgBouncer before 1.21) cannot carry from one transaction to the next.
    conn = psycopg.connect(url, autocommit=True, prepare_threshold=None, connect_timeout=5)
    try:
        # The outcome's commit must be durable before it is answered, like
        # the proxy's: a server or role default of synchronous_commit off
        # would let a crash of PostgreSQL lose a call the client was told
        # had run. lock_timeout bounds the fence's wait for the call's row
        # (held by a proxy's claim for a moment), as busy_timeout does on
        # SQLite; set_config, since SET takes no parameters.
        conn.execute("SELECT set_config('synchronous_commit', 'on', false)")
        conn.execute("SELECT set_config('lock_timeout', %s, false)", (f"{int(lock_timeout_ms)}ms",))
        (n,) = conn.execute(_HAS_TABLES_POSTGRES).fetchone()
        if n != 2:
            raise SetupError(
                f"{_redact(url)} has no outbox tables (calls, effects) in schema "
                f"{conn.execute('SELECT current_schema()').fetchone()[0]}: mcp-outbox proxy creates them; start it first"
            )
    except BaseException:
        conn.close()
        raise
    return conn


def _redact(url: str) -> str:
    """url without its password, for errors."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(":" + parts.password + "@", ":xxxxx@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def _answer(recorded: str, result: Mapping[str, Any]) -> dict[str, Any]:
    # Answer what was recorded (decoded again, so that tuples, subclasses
    # and later changes to the handler's dict cannot make the two differ),
    # plus the handler's _meta, which is not recorded.
    answer = json.loads(recorded)
    if "_meta" in result:
        answer["_meta"] = result["_meta"]
    return answer
