"""Unit tests of mcp_outbox_upstream.py: the fence, the rollbacks, what is recorded.

The database must be one the proxy's schema created (the outbox tables are
the proxy's, and their SQL is the contract): cmd/mcp-outbox's
TestUpstreamContractPyModule prepares it with schema.Open and runs

    MCP_OUTBOX_TEST_DB=<file> python -m unittest -v test_mcp_outbox_upstream

Each test plays the proxy's part with a connection of its own: it inserts a
claim (a calls row in_flight) and reads back what the module committed.
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import tempfile
import time
import unittest

from mcp_outbox_upstream import (
    CLAIM_META,
    Effect,
    SetupError,
    ToolFailure,
    Upstream,
    read_claim,
    text_result,
)


def _db_path() -> str:
    path = os.environ.get("MCP_OUTBOX_TEST_DB", "")
    if not path:
        raise unittest.SkipTest("MCP_OUTBOX_TEST_DB is not set: run through go test (TestUpstreamContractPyModule)")
    return path


class RunCallTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.path = _db_path()
        cls.up = Upstream(cls.path)
        cls.up.conn.execute(
            "CREATE TABLE IF NOT EXISTS things (id INTEGER PRIMARY KEY, name TEXT NOT NULL, call_id TEXT NOT NULL)"
        )
        # The proxy's side. isolation_level=None: every statement commits on
        # its own, so the module's connection sees it at once.
        cls.proxy = sqlite3.connect(cls.path, isolation_level=None, timeout=5)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.proxy.close()
        cls.up.close()

    def claim(self, tool: str = "make_thing") -> tuple[dict, dict]:
        """Inserts an in_flight calls row as the proxy does; returns the
        request's _meta carrying the claim, and the claim."""
        now = int(time.time() * 1000)
        c = {
            "key": "unit-" + secrets.token_hex(8),
            "callId": "call_" + secrets.token_hex(12),
            "owner": "unit-test/" + secrets.token_hex(4) + "#1",
        }
        cur = self.proxy.execute(
            """INSERT INTO calls (uid, principal, key, key_source, tool, args_hash, state, owner, lease_until,
                                  created_at, expires_at)
               VALUES (?, 'local', ?, 'meta', ?, ?, 'in_flight', ?, ?, ?, ?)""",
            (c["callId"], c["key"], tool, secrets.token_hex(32), c["owner"], now + 60_000, now, now + 86_400_000),
        )
        c["rowId"] = cur.lastrowid
        return {CLAIM_META: c, "progressToken": "tok"}, c

    def row(self, c: dict) -> tuple:
        return self.proxy.execute(
            "SELECT state, owner, lease_until, result, completed_at FROM calls WHERE id = ?", (c["rowId"],)
        ).fetchone()

    def things(self, name: str) -> list[tuple]:
        return self.proxy.execute("SELECT id, call_id FROM things WHERE name = ? ORDER BY id", (name,)).fetchall()

    def effects(self, prefix: str) -> list[tuple]:
        return self.proxy.execute(
            """SELECT call_id, seq, destination, method, path, headers, body, idempotency_key, state
               FROM effects WHERE substr(idempotency_key, 1, length(?)) = ? ORDER BY id""",
            (prefix, prefix),
        ).fetchall()

    def count_effects(self) -> int:
        return self.proxy.execute("SELECT count(*) FROM effects").fetchone()[0]

    def assert_untouched(self, c: dict) -> None:
        state, owner, _, result, completed_at = self.row(c)
        self.assertEqual((state, owner, result, completed_at), ("in_flight", c["owner"], None, None))

    def make_thing(self, name: str, effects: int = 1):
        """work that writes a thing and enqueues effects."""

        def work(tx, call_id, now):
            thing = tx.execute("INSERT INTO things (name, call_id) VALUES (?, ?)", (name, call_id)).lastrowid
            return (
                text_result(f"made {name}", {"thingId": thing}),
                [
                    Effect("payments", f"/v1/things/{n}", headers={"Content-Type": "application/json"},
                           body=json.dumps({"thing": thing}))
                    for n in range(1, effects + 1)
                ],
            )

        return work

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
        self.assertFalse(self.up.conn.in_transaction)

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
        self.assertFalse(self.up.conn.in_transaction)

    def test_lost_at_settle_rolls_back_everything(self) -> None:
        """The fence that matters: the outcome UPDATE changes no row. From
        outside, BEGIN IMMEDIATE makes that impossible, so work itself plays
        the attempt that takes the call over; its business rows, its effects
        and the takeover all roll back."""
        meta, c = self.claim()

        def work(tx, call_id, now):
            out = self.make_thing("t-settle")(tx, call_id, now)
            tx.execute("UPDATE calls SET owner = 'thief#2' WHERE id = ?", (c["rowId"],))
            return out

        before = self.count_effects()
        res = self.up.run_call(meta, work)
        self.assertTrue(res["isError"])
        self.assertTrue(res["content"][0]["text"].startswith("claim lost"), res)
        self.assert_untouched(c)
        self.assertEqual(self.things("t-settle"), [])
        self.assertEqual(self.count_effects(), before)
        self.assertFalse(self.up.conn.in_transaction)

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
        self.assertFalse(self.up.conn.in_transaction)

    def test_bad_effect_rolls_back(self) -> None:
        meta, c = self.claim()

        def work(tx, call_id, now):
            tx.execute("INSERT INTO things (name, call_id) VALUES ('t-bad-effect', ?)", (call_id,))
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
                self.assertFalse(impatient.conn.in_transaction)
            finally:
                self.proxy.execute("ROLLBACK")
            self.assert_untouched(c)
            self.assertEqual(self.things("t-locked"), [])
        finally:
            impatient.close()

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

    def test_pragmas(self) -> None:
        up = Upstream(_db_path())
        try:
            self.assertEqual(up.conn.execute("PRAGMA synchronous").fetchone()[0], 2)  # FULL
            self.assertEqual(up.conn.execute("PRAGMA busy_timeout").fetchone()[0], 5000)
            self.assertIsNone(up.conn.isolation_level)
        finally:
            up.close()


if __name__ == "__main__":
    unittest.main()
