"""Unit tests of mcp_outbox_upstream.py: the fence, the rollbacks, what is recorded.

The database must be one the proxy's schema created (the outbox tables are
the proxy's, and their SQL is the contract): cmd/mcp-outbox's
TestUpstreamContractPyModule prepares an SQLite file with schema.Open and runs

    MCP_OUTBOX_TEST_DB=<file> python -m unittest -v test_mcp_outbox_upstream

and TestUpstreamContractPyModulePostgres the same with a postgres:// URL of a
fresh database (psycopg 3 must be installed then). The tests of one store's
own behaviour (its locks, its settings) are defined only for that store, so
that nothing is skipped in either run.

Each test plays the proxy's part with a connection of its own: it inserts a
claim (a calls row in_flight) and reads back what the module committed.
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import tempfile
import threading
import time
import unittest
from typing import Any

from mcp_outbox_upstream import (
    CLAIM_META,
    Effect,
    SetupError,
    ToolFailure,
    Upstream,
    is_postgres_url,
    read_claim,
    text_result,
)

POSTGRES = is_postgres_url(os.environ.get("MCP_OUTBOX_TEST_DB", ""))
if POSTGRES:
    import psycopg
    import psycopg.errors


def _db_path() -> str:
    path = os.environ.get("MCP_OUTBOX_TEST_DB", "")
    if not path:
        raise unittest.SkipTest("MCP_OUTBOX_TEST_DB is not set: run through go test (TestUpstreamContractPyModule)")
    return path


def q(sql: str) -> str:
    """The tests' SQL, written with ? placeholders, in the store's own: %s
    for psycopg. (Test SQL only; the module's statements are written out
    for each store.)"""
    return sql.replace("?", "%s") if POSTGRES else sql


def connect_proxy_side(target: str) -> Any:
    """The proxy's side: a connection of its own on which every statement
    commits on its own, so that the module's connection sees it at once."""
    if POSTGRES:
        return psycopg.connect(target, autocommit=True)
    return sqlite3.connect(target, isolation_level=None, timeout=5)


def now_ms() -> int:
    return int(time.time() * 1000)


class CallCase(unittest.TestCase):
    """The module's connection, the proxy's side, and helpers; no tests."""

    @classmethod
    def setUpClass(cls) -> None:
        cls.path = _db_path()
        cls.up = Upstream(cls.path)
        id_type = "BIGSERIAL" if POSTGRES else "INTEGER"
        cls.up.conn.execute(
            f"CREATE TABLE IF NOT EXISTS things (id {id_type} PRIMARY KEY, name TEXT NOT NULL, call_id TEXT NOT NULL)"
        )
        cls.proxy = connect_proxy_side(cls.path)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.proxy.close()
        cls.up.close()

    def execute(self, sql: str, params: Any = ()) -> Any:
        """Runs a statement on the proxy's side."""
        return self.proxy.execute(q(sql), params)

    def claim(self, tool: str = "make_thing", lease_ms: int = 60_000) -> tuple[dict, dict]:
        """Inserts an in_flight calls row as the proxy does; returns the
        request's _meta carrying the claim, and the claim."""
        now = now_ms()
        c = {
            "key": "unit-" + secrets.token_hex(8),
            "callId": "call_" + secrets.token_hex(12),
            "owner": "unit-test/" + secrets.token_hex(4) + "#1",
        }
        (c["rowId"],) = self.execute(
            """INSERT INTO calls (uid, principal, key, key_source, tool, args_hash, state, owner, lease_until,
                                  created_at, expires_at)
               VALUES (?, 'local', ?, 'meta', ?, ?, 'in_flight', ?, ?, ?, ?) RETURNING id""",
            (c["callId"], c["key"], tool, secrets.token_hex(32), c["owner"], now + lease_ms, now, now + 86_400_000),
        ).fetchone()
        return {CLAIM_META: c, "progressToken": "tok"}, c

    def row(self, c: dict) -> tuple:
        return self.execute(
            "SELECT state, owner, lease_until, result, completed_at FROM calls WHERE id = ?", (c["rowId"],)
        ).fetchone()

    def things(self, name: str) -> list[tuple]:
        return self.execute("SELECT id, call_id FROM things WHERE name = ? ORDER BY id", (name,)).fetchall()

    def effects(self, prefix: str) -> list[tuple]:
        return self.execute(
            """SELECT call_id, seq, destination, method, path, headers, body, idempotency_key, state
               FROM effects WHERE substr(idempotency_key, 1, length(?)) = ? ORDER BY id""",
            (prefix, prefix),
        ).fetchall()

    def count_effects(self) -> int:
        return self.execute("SELECT count(*) FROM effects").fetchone()[0]

    def assert_untouched(self, c: dict) -> None:
        state, owner, _, result, completed_at = self.row(c)
        self.assertEqual((state, owner, result, completed_at), ("in_flight", c["owner"], None, None))

    def make_thing(self, name: str, effects: int = 1):
        """work that writes a thing and enqueues effects."""

        def work(tx, call_id, now):
            (thing,) = tx.execute(q("INSERT INTO things (name, call_id) VALUES (?, ?) RETURNING id"), (name, call_id)).fetchone()
            return (
                text_result(f"made {name}", {"thingId": thing}),
                [
                    Effect("payments", f"/v1/things/{n}", headers={"Content-Type": "application/json"},
                           body=json.dumps({"thing": thing}))
                    for n in range(1, effects + 1)
                ],
            )

        return work


class RunCallTest(CallCase):
    """What run_call does on either store."""

    def test_completed(self) -> None:
        meta, c = self.claim()
        res = self.up.run_call(meta, self.make_thing("t-completed", effects=2))
        self.assertFalse(res["isError"])
        state, owner, lease_until, result, completed_at = self.row(c)
        self.assertEqual((state, owner, lease_until), ("completed", "", 0))
        self.assertIsNotNone(completed_at)
        self.assertEqual(json.loads(result), res)
        things = self.things("t-completed")
        self.assertEqual(things, [(res["structuredContent"]["thingId"], c["callId"])])
        effs = self.effects(c["callId"])
        self.assertEqual([e[7] for e in effs], [c["callId"] + "-1", c["callId"] + "-2"])
        for seq, e in enumerate(effs, start=1):
            self.assertEqual(e[:5], (c["rowId"], seq, "payments", "POST", f"/v1/things/{seq}"))
            self.assertEqual(json.loads(e[5]), {"Content-Type": "application/json"})
            self.assertIsInstance(e[6], bytes)  # a str body is stored as a BLOB
            self.assertEqual(e[8], "pending")
        self.assertFalse(self.up.in_transaction)

    def test_result_recorded_without_meta(self) -> None:
        meta, c = self.claim()

        def work(tx, call_id, now):
            r = text_result("ünïcode ✓", {"n": 1})
            r["_meta"] = {"trace": "x"}
            return r, ()

        res = self.up.run_call(meta, work)
        self.assertEqual(res["_meta"], {"trace": "x"})
        recorded = json.loads(self.row(c)[3])
        self.assertNotIn("_meta", recorded)
        self.assertEqual(recorded, {k: v for k, v in res.items() if k != "_meta"})

    def test_stale_owner_writes_nothing(self) -> None:
        """The fence at the start: another attempt owns the call. work never
        runs, and nothing of the call is written."""
        meta, c = self.claim()
        meta[CLAIM_META] = dict(c, owner="an-attempt-that-was-taken-over#7")
        ran = []

        def work(tx, call_id, now):
            ran.append(call_id)
            return self.make_thing("t-stale")(tx, call_id, now)

        before = self.count_effects()
        res = self.up.run_call(meta, work)
        self.assertTrue(res["isError"])
        self.assertTrue(res["content"][0]["text"].startswith("claim lost: call " + c["callId"]), res)
        self.assertEqual(ran, [])
        self.assert_untouched(c)
        self.assertEqual(self.things("t-stale"), [])
        self.assertEqual(self.count_effects(), before)
        self.assertFalse(self.up.in_transaction)

    def test_lost_at_settle_rolls_back_everything(self) -> None:
        """The fence that matters: the outcome UPDATE changes no row. From
        outside, BEGIN IMMEDIATE (SQLite) or the fence's row lock (PostgreSQL)
        makes that impossible, so work itself plays
        the attempt that takes the call over; its business rows, its effects
        and the takeover all roll back."""
        meta, c = self.claim()

        def work(tx, call_id, now):
            out = self.make_thing("t-settle")(tx, call_id, now)
            tx.execute(q("UPDATE calls SET owner = 'thief#2' WHERE id = ?"), (c["rowId"],))
            return out

        before = self.count_effects()
        res = self.up.run_call(meta, work)
        self.assertTrue(res["isError"])
        self.assertTrue(res["content"][0]["text"].startswith("claim lost"), res)
        self.assert_untouched(c)
        self.assertEqual(self.things("t-settle"), [])
        self.assertEqual(self.count_effects(), before)
        self.assertFalse(self.up.in_transaction)

    def test_settled_claim_again(self) -> None:
        meta, c = self.claim()
        first = self.up.run_call(meta, self.make_thing("t-again"))
        again = self.up.run_call(meta, self.make_thing("t-again"))
        self.assertTrue(again["isError"])
        self.assertTrue(again["content"][0]["text"].startswith("claim lost"))
        self.assertEqual(json.loads(self.row(c)[3]), first)
        self.assertEqual(len(self.things("t-again")), 1)
        self.assertEqual(len(self.effects(c["callId"])), 1)

    def test_tool_failure_recorded_failed(self) -> None:
        meta, c = self.claim()

        def work(tx, call_id, now):
            self.make_thing("t-failure")(tx, call_id, now)
            raise ToolFailure("amount out of range")

        before = self.count_effects()
        res = self.up.run_call(meta, work)
        self.assertEqual(res, text_result("amount out of range", is_error=True))
        state, owner, _, result, completed_at = self.row(c)
        self.assertEqual((state, owner), ("failed", ""))
        self.assertIsNotNone(completed_at)
        self.assertEqual(json.loads(result), res)
        self.assertEqual(self.things("t-failure"), [])
        self.assertEqual(self.count_effects(), before)

    def test_exception_rolls_back_and_propagates(self) -> None:
        meta, c = self.claim()

        def work(tx, call_id, now):
            self.make_thing("t-exception")(tx, call_id, now)
            raise RuntimeError("the handler broke")

        with self.assertRaisesRegex(RuntimeError, "the handler broke"):
            self.up.run_call(meta, work)
        self.assert_untouched(c)
        self.assertEqual(self.things("t-exception"), [])
        self.assertFalse(self.up.in_transaction)

    def test_bad_effect_rolls_back(self) -> None:
        meta, c = self.claim()

        def work(tx, call_id, now):
            tx.execute(q("INSERT INTO things (name, call_id) VALUES ('t-bad-effect', ?)"), (call_id,))
            return text_result("x"), [Effect("payments", "/v1/x", headers={"Idempotency-Key": "mine"})]

        with self.assertRaisesRegex(ValueError, "Idempotency-Key"):
            self.up.run_call(meta, work)
        self.assert_untouched(c)
        self.assertEqual(self.things("t-bad-effect"), [])

    def test_unclaimed(self) -> None:
        res = self.up.run_call(None, self.make_thing("t-unclaimed"))
        self.assertFalse(res["isError"])
        ((_, call_id),) = self.things("t-unclaimed")
        self.assertRegex(call_id, r"^call_[0-9a-f]{24}$")
        ((effect_call_id, seq, *_rest),) = self.effects(call_id)
        self.assertIsNone(effect_call_id)
        self.assertEqual(seq, 1)
        self.assertEqual(self.effects(call_id)[0][7], call_id + "-1")

    def test_not_cooperating_ignores_claim(self) -> None:
        other = Upstream(self.path, cooperate=False)
        try:
            meta, c = self.claim()
            before = self.count_effects()
            res = other.run_call(meta, self.make_thing("t-noncoop"))
            self.assertFalse(res["isError"])
            self.assert_untouched(c)
            ((_, call_id),) = self.things("t-noncoop")
            self.assertNotEqual(call_id, c["callId"])
            self.assertEqual(self.count_effects(), before)
        finally:
            other.close()

    def test_read_claim(self) -> None:
        self.assertIsNone(read_claim(None))
        self.assertIsNone(read_claim({"progressToken": 1}))
        good = {"key": "k", "callId": "call_x", "rowId": 7, "owner": "o"}
        self.assertEqual(read_claim({CLAIM_META: good}).row_id, 7)
        for bad in (
            None,
            "x",
            dict(good, rowId=True),  # bool is an int to Python
            dict(good, rowId="7"),
            dict(good, owner=""),
            dict(good, callId=""),
            {k: v for k, v in good.items() if k != "key"},
        ):
            with self.subTest(bad=bad), self.assertRaisesRegex(ValueError, "malformed"):
                read_claim({CLAIM_META: bad})


class SetupTest(unittest.TestCase):
    def setUp(self) -> None:
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def test_missing_file_is_not_created(self) -> None:
        path = os.path.join(self.dir.name, "missing?#.db")
        with self.assertRaises(sqlite3.OperationalError):
            Upstream(path)
        self.assertFalse(os.path.exists(path))

    def test_not_wal(self) -> None:
        path = os.path.join(self.dir.name, "rollback-journal.db")
        sqlite3.connect(path).close()
        with self.assertRaisesRegex(SetupError, "not in WAL mode"):
            Upstream(path)

    def test_no_outbox_tables(self) -> None:
        path = os.path.join(self.dir.name, "wal.db")
        db = sqlite3.connect(path)
        db.execute("PRAGMA journal_mode = WAL")
        db.close()
        with self.assertRaisesRegex(SetupError, "no outbox tables"):
            Upstream(path)


if not POSTGRES:

    class SQLiteTest(CallCase):
        """What only SQLite does: the write lock, the pragmas."""

        def test_write_lock_held(self) -> None:
            """BEGIN IMMEDIATE waits for the write lock up front (busy_timeout)
            and fails there, before anything of the call is written."""
            impatient = Upstream(self.path, busy_timeout_ms=50)
            try:
                meta, c = self.claim()
                self.proxy.execute("BEGIN IMMEDIATE")
                try:
                    with self.assertRaisesRegex(sqlite3.OperationalError, "locked"):
                        impatient.run_call(meta, self.make_thing("t-locked"))
                    self.assertFalse(impatient.in_transaction)
                finally:
                    self.proxy.execute("ROLLBACK")
                self.assert_untouched(c)
                self.assertEqual(self.things("t-locked"), [])
            finally:
                impatient.close()

        def test_pragmas(self) -> None:
            up = Upstream(_db_path())
            try:
                self.assertEqual(up.dialect, "sqlite")
                self.assertEqual(up.conn.execute("PRAGMA synchronous").fetchone()[0], 2)  # FULL
                self.assertEqual(up.conn.execute("PRAGMA busy_timeout").fetchone()[0], 5000)
                self.assertIsNone(up.conn.isolation_level)
            finally:
                up.close()

else:

    class PostgresTest(CallCase):
        """What only PostgreSQL does: the fence locks the call's row and checks
        the lease; a failed statement aborts the transaction; the settings."""

        def test_lease_passed(self) -> None:
            """An owner whose lease has passed no longer holds the claim, even
            if nobody took the call over yet."""
            meta, c = self.claim(lease_ms=-1)
            res = self.up.run_call(meta, self.make_thing("t-lease"))
            self.assertTrue(res["isError"])
            self.assertTrue(res["content"][0]["text"].startswith("claim lost"), res)
            self.assertEqual(self.row(c)[:2], ("in_flight", c["owner"]))
            self.assertEqual(self.things("t-lease"), [])
            self.assertFalse(self.up.in_transaction)

        def test_fence_waits_for_takeover(self) -> None:
            """A takeover in progress holds the call's row; the fence waits for
            it and, at READ COMMITTED, checks the row it committed: claim lost,
            nothing written."""
            meta, c = self.claim()
            thief = connect_proxy_side(self.path)
            try:
                thief.execute("BEGIN")
                thief.execute("UPDATE calls SET owner = 'thief#2' WHERE id = %s", (c["rowId"],))
                results: list[Any] = []
                runner = threading.Thread(
                    target=lambda: results.append(self.up.run_call(meta, self.make_thing("t-takeover")))
                )
                runner.start()
                self.wait_for_lock_wait()
                thief.execute("COMMIT")
                runner.join(10)
                self.assertFalse(runner.is_alive())
            finally:
                thief.close()
            (res,) = results
            self.assertTrue(res["isError"])
            self.assertTrue(res["content"][0]["text"].startswith("claim lost"), res)
            self.assertEqual(self.row(c)[:2], ("in_flight", "thief#2"))
            self.assertEqual(self.things("t-takeover"), [])

        def wait_for_lock_wait(self) -> None:
            """Polls until a session of this database waits for a lock."""
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                (n,) = self.execute(
                    """SELECT count(*) FROM pg_stat_activity
                       WHERE datname = current_database() AND wait_event_type = 'Lock'"""
                ).fetchone()
                if n > 0:
                    return
                time.sleep(0.01)
            self.fail("the fence never waited for the call's row")

        def test_row_lock_held(self) -> None:
            """The fence waits for the call's row at most lock_timeout, and
            fails there, before anything of the call is written."""
            impatient = Upstream(self.path, busy_timeout_ms=50)
            try:
                meta, c = self.claim()
                self.proxy.execute("BEGIN")
                try:
                    self.proxy.execute("SELECT 1 FROM calls WHERE id = %s FOR UPDATE", (c["rowId"],))
                    with self.assertRaises(psycopg.errors.LockNotAvailable):
                        impatient.run_call(meta, self.make_thing("t-locked"))
                    self.assertFalse(impatient.in_transaction)
                finally:
                    self.proxy.execute("ROLLBACK")
                self.assert_untouched(c)
                self.assertEqual(self.things("t-locked"), [])
            finally:
                impatient.close()

        def test_failed_statement_then_tool_failure(self) -> None:
            """A statement of work fails (here a unique violation) and work
            answers it with ToolFailure: rolling back to work's savepoint
            clears PostgreSQL's aborted state, and the failure is recorded."""
            meta, c = self.claim()
            self.execute("CREATE TABLE IF NOT EXISTS uniq (name TEXT PRIMARY KEY)")
            self.execute("INSERT INTO uniq VALUES ('taken') ON CONFLICT DO NOTHING")

            def work(tx, call_id, now):
                self.make_thing("t-uniq")(tx, call_id, now)
                try:
                    tx.execute("INSERT INTO uniq VALUES ('taken')")
                except psycopg.errors.UniqueViolation:
                    raise ToolFailure("name taken") from None
                return text_result("unreachable"), []

            res = self.up.run_call(meta, work)
            self.assertEqual(res, text_result("name taken", is_error=True))
            self.assertEqual(self.row(c)[:2], ("failed", ""))
            self.assertEqual(self.things("t-uniq"), [])
            self.assertFalse(self.up.in_transaction)

        def test_failed_statement_propagates(self) -> None:
            meta, c = self.claim()

            def work(tx, call_id, now):
                self.make_thing("t-bad-sql")(tx, call_id, now)
                tx.execute("INSERT INTO no_such_table VALUES (1)")
                return text_result("unreachable"), []

            with self.assertRaises(psycopg.errors.UndefinedTable):
                self.up.run_call(meta, work)
            self.assert_untouched(c)
            self.assertEqual(self.things("t-bad-sql"), [])
            self.assertFalse(self.up.in_transaction)

        def test_commit_of_aborted_transaction(self) -> None:
            """What schema/README.md warns of: COMMIT after a failed statement
            rolls back without an error. run_call cannot get there: RELEASE
            of work's savepoint fails first."""
            conn = connect_proxy_side(self.path)
            try:
                conn.execute("BEGIN")
                conn.execute("INSERT INTO things (name, call_id) VALUES ('t-aborted', 'x')")
                with self.assertRaises(psycopg.errors.DivisionByZero):
                    conn.execute("SELECT 1 / 0")
                self.assertEqual(conn.execute("COMMIT").statusmessage, "ROLLBACK")
                self.assertEqual(self.things("t-aborted"), [])

                meta, c = self.claim()

                def work(tx, call_id, now):
                    try:
                        tx.execute("SELECT 1 / 0")
                    except psycopg.errors.DivisionByZero:
                        pass  # swallowed: the transaction stays aborted
                    return text_result("looks fine"), []

                with self.assertRaises(psycopg.errors.InFailedSqlTransaction):
                    self.up.run_call(meta, work)
                self.assert_untouched(c)
            finally:
                conn.close()

        def test_settings(self) -> None:
            up = Upstream(_db_path())
            try:
                self.assertEqual(up.dialect, "postgres")
                show = lambda name: up.conn.execute(f"SHOW {name}").fetchone()[0]  # noqa: E731
                self.assertEqual(show("synchronous_commit"), "on")
                self.assertEqual(show("lock_timeout"), "5s")
                self.assertTrue(up.conn.autocommit)
            finally:
                up.close()

        def test_no_outbox_tables(self) -> None:
            """A database (here a search_path) without the outbox tables."""
            sep = "&" if "?" in self.path else "?"
            with self.assertRaisesRegex(SetupError, "no outbox tables"):
                Upstream(self.path + sep + "options=-csearch_path%3Dno_such_schema")


if __name__ == "__main__":
    unittest.main()
