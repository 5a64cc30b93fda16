"""Shared parts of the Python matrix clients (client.py, graph.py).

A matrix client reads a plan (JSON file named on the command line), runs one
scenario of one logical `charge` call, and prints exactly one JSON report as
the last line of stdout. Exit 0 when the run was carried out, whatever the
tool answered; exit 2 on a usage error or an unexpected exception. Logs, and
the stdio server's stderr, go to stderr.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import sys
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from importlib import metadata
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
from anyio.abc import ObjectSendStream
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import McpError
from mcp.shared.message import SessionMessage
from mcp.types import CONNECTION_CLOSED, CallToolResult, InitializeResult, TextContent

# Where mcp-outbox reports on a recorded call in a result's _meta.
CALL_META = "io.github.mcp-outbox/call"

# mcp 1.29.1 and 1.30.0 (shared/session.py, send_request): a request that
# outlives its read timeout raises McpError with code httpx.codes.REQUEST_TIMEOUT,
# i.e. 408 (not the TypeScript SDK's -32001), and sends no
# notifications/cancelled; the server's late response is dropped as an
# unknown request id. A transport that ends (the stdio server died) fails
# every pending request with McpError CONNECTION_CLOSED (-32000,
# "Connection closed").
TIMEOUT_CODE = 408

# The crash scenario gives up waiting for its kill condition after this long.
KILL_POLL_DEADLINE_S = 20.0
KILL_POLL_INTERVAL_S = 0.02


class UsageError(Exception):
    """The plan or the command line is not what the contract asks for."""


def log(msg: str) -> None:
    print(f"{os.path.basename(sys.argv[0])}: {msg}", file=sys.stderr, flush=True)


def load_plan(argv: list[str]) -> dict[str, Any]:
    if len(argv) != 2:
        raise UsageError(f"usage: {os.path.basename(argv[0])} PLAN_FILE")
    try:
        with open(argv[1], encoding="utf-8") as f:
            plan = json.load(f)
    except (OSError, ValueError) as exc:
        raise UsageError(f"read plan {argv[1]}: {exc}") from exc
    if not isinstance(plan, dict):
        raise UsageError("plan: not a JSON object")
    for field in ("scenario", "tool"):
        if not isinstance(plan.get(field), str) or not plan[field]:
            raise UsageError(f"plan: {field} missing")
    if not isinstance(plan.get("arguments", {}), dict):
        raise UsageError("plan: arguments is not an object")
    return plan


def need(plan: dict[str, Any], field: str) -> Any:
    """The plan's field, which this scenario cannot do without."""
    value = plan.get(field)
    if value in (None, "", {}):
        raise UsageError(f"plan: {field} missing for scenario {plan['scenario']}")
    return value


def versions(*dists: str) -> dict[str, str]:
    out = {"python": sys.version.split()[0]}
    for d in dists:
        try:
            out[d] = metadata.version(d)
        except metadata.PackageNotFoundError:
            out[d] = ""
    return out


def main(client: str, dists: tuple[str, ...], run: Callable[[dict[str, Any], dict[str, Any]], Awaitable[None]]) -> None:
    """Run `run(plan, report)` and print the report; never returns."""
    report: dict[str, Any] = {
        "client": client,
        "versions": versions(*dists),
        "protocolVersion": None,
        "tools": [],
        "attempts": [],
        "error": "",
    }
    code = 0
    try:
        plan = load_plan(sys.argv)
        report["scenario"] = plan["scenario"]
        report["keySent"] = bool(plan.get("key"))
        anyio.run(run, plan, report)
    except UsageError as exc:
        report["error"] = str(exc)
        code = 2
    except BaseException as exc:  # noqa: BLE001 - the report must be printed whatever happened
        traceback.print_exception(exc, file=sys.stderr)
        report["error"] = describe(exc)
        code = 2
    sys.stdout.write(json.dumps(report, default=str) + "\n")
    sys.stdout.flush()
    sys.exit(code)


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups; anyio task groups wrap them."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for e in exc.exceptions for leaf in leaves(e)]
    return [exc]


def describe(exc: BaseException) -> str:
    return "; ".join(f"{type(e).__name__}: {e}" for e in leaves(exc))


def error_fields(exc: BaseException) -> dict[str, Any]:
    """The report fields for an attempt that raised instead of answering."""
    inner = leaves(exc)
    first = inner[0]
    if isinstance(first, McpError):
        code = first.error.code
        kind = {TIMEOUT_CODE: "timeout", CONNECTION_CLOSED: "closed"}.get(code, "other")
        return {"errorKind": kind, "error": first.error.message, "errorCode": code}
    if isinstance(first, (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, BrokenPipeError, ConnectionError)):
        return {"errorKind": "closed", "error": describe(exc)}
    if isinstance(first, TimeoutError):
        return {"errorKind": "timeout", "error": describe(exc)}
    return {"errorKind": "other", "error": describe(exc)}


def texts_of(result: CallToolResult) -> list[str]:
    return [c.text for c in result.content if isinstance(c, TextContent)]


def charge_id(structured: Any, texts: list[str], field: str) -> int:
    """The charge id from structured content, else from the text (JSON, "charge #1", "charge 1"); 0 if none."""
    if isinstance(structured, dict) and isinstance(structured.get(field), int):
        return structured[field]
    for text in texts:
        try:
            doc = json.loads(text)
        except ValueError:
            doc = None
        if isinstance(doc, dict) and isinstance(doc.get(field), int):
            return doc[field]
        m = re.search(r"charge\s*#?\s*(\d+)", text) or re.search(rf'"?{re.escape(field)}"?\s*[:=]\s*(\d+)', text)
        if m:
            return int(m.group(1))
    return 0


def call_fields(result_meta: dict[str, Any] | None) -> dict[str, Any]:
    """replayed (null when not visible) and keySource (which key the layer
    used: meta, header, fingerprint, ...) from the layer's _meta on a result."""
    call = (result_meta or {}).get(CALL_META)
    call = call if isinstance(call, dict) else {}
    value = call.get("replayed")
    out: dict[str, Any] = {"replayed": value if isinstance(value, bool) else None}
    if isinstance(call.get("keySource"), str):
        out["keySource"] = call["keySource"]
    return out


def result_fields(result: CallToolResult, plan: dict[str, Any]) -> dict[str, Any]:
    """The report fields for an attempt that got a tools/call result."""
    texts = texts_of(result)
    out: dict[str, Any] = {"errorKind": "", **call_fields(result.meta)}
    if result.isError:
        out["toolError"] = "\n".join(texts)
        out["chargeId"] = 0
    else:
        out["chargeId"] = charge_id(result.structuredContent, texts, plan.get("chargeIdField", "charge_id"))
    return out


def outcome(entry: dict[str, Any]) -> str:
    """A few words on an attempt's outcome, for its "what"."""
    if entry.get("errorKind"):
        return f"failed ({entry['errorKind']}, code {entry.get('errorCode')}): {entry.get('error')}"
    if entry.get("toolError"):
        return f"tool error: {entry['toolError']}"
    suffix = {True: " (replayed)", False: " (ran)", None: ""}[entry.get("replayed")]
    return f"charge #{entry.get('chargeId')}{suffix}"


class Stopwatch:
    def __init__(self) -> None:
        self.start = time.monotonic()

    def ms(self) -> int:
        return round((time.monotonic() - self.start) * 1000)


def stdio_params(plan: dict[str, Any]) -> StdioServerParameters:
    server = need(plan, "server")
    if not isinstance(server.get("command"), str) or not os.path.isabs(server["command"]):
        raise UsageError("plan: server.command must be an absolute path")
    # Without env, stdio_client passes only HOME, LOGNAME, PATH, SHELL, TERM,
    # USER; the contract says the plan's env ADDS to the inherited environment.
    return StdioServerParameters(
        command=server["command"],
        args=list(server.get("args") or []),
        env={**os.environ, **(server.get("env") or {})},
        cwd=server.get("cwd") or None,
    )


class Wire:
    """What one run's MCP library did besides the attempts: the methods it
    sent (was there a notifications/cancelled?), responses that arrived for a
    request it had already given up on, and errors raised while closing."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.late: list[str] = []
        self.close_errors: list[str] = []

    def note(self, report: dict[str, Any]) -> None:
        report["sent"] = self.sent
        report["cancelledSent"] = "notifications/cancelled" in self.sent
        report["lateResponses"] = len(self.late)
        report["closeErrors"] = self.close_errors

    async def message_handler(self, message: Any) -> None:
        # mcp 1.29.1/1.30.0 (shared/session.py, _handle_response) hand a
        # response whose request already timed out to the message handler as
        # RuntimeError("Received response with an unknown request ID: ...").
        if isinstance(message, Exception):
            text = str(message)
            if text.startswith("Received response with an unknown request ID"):
                self.late.append(text)
                log(f"late response: {text[:300]}")
            else:
                log(f"incoming error: {text[:300]}")
        await anyio.lowlevel.checkpoint()

    @asynccontextmanager
    async def recording(self, write: ObjectSendStream[SessionMessage]) -> AsyncIterator[ObjectSendStream[SessionMessage]]:
        """A write stream that relays to `write` and records each message's
        method (or "response")."""
        send, recv = anyio.create_memory_object_stream[SessionMessage](0)

        async def relay() -> None:
            async with recv:
                async for msg in recv:
                    self.sent.append(getattr(msg.message.root, "method", None) or "response")
                    try:
                        await write.send(msg)
                    except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                        # The transport is gone (server killed); the session
                        # fails its pending requests when its read side ends.
                        pass

        async with anyio.create_task_group() as tg:
            tg.start_soon(relay)
            try:
                yield send
            finally:
                send.close()

    @asynccontextmanager
    async def session(self, read: Any, write: ObjectSendStream[SessionMessage]) -> AsyncIterator[tuple[ClientSession, InitializeResult]]:
        async with self.recording(write) as rec, ClientSession(read, rec, message_handler=self.message_handler) as session:
            init = await session.initialize()
            yield session, init

    @asynccontextmanager
    async def stdio(self, plan: dict[str, Any]) -> AsyncIterator[tuple[ClientSession, InitializeResult]]:
        """Spawn the plan's server and yield an initialized session. On exit
        stdio_client closes the server's stdin and waits up to 2 s for it to
        exit (then SIGTERM, then SIGKILL): mcp 1.29.1/1.30.0 client/stdio."""
        finished = False
        try:
            async with stdio_client(stdio_params(plan), errlog=sys.stderr) as (read, write), self.session(read, write) as pair:
                yield pair
                finished = True
        except Exception as exc:
            if not finished:
                raise
            self.closed_with(exc)

    @asynccontextmanager
    async def http(self, url: str) -> AsyncIterator[tuple[ClientSession, InitializeResult, Callable[[], str | None]]]:
        """An initialized session over Streamable HTTP. streamablehttp_client
        is deprecated in favour of streamable_http_client in mcp 1.29.1 and
        1.30.0; its default httpx client has MCP's timeouts (30 s, read
        300 s). On exit it DELETEs the session (terminate_on_close)."""
        finished = False
        try:
            async with streamable_http_client(url, terminate_on_close=True) as (read, write, session_id), self.session(read, write) as (session, init):
                yield session, init, session_id
                finished = True
        except Exception as exc:
            if not finished:
                raise
            self.closed_with(exc)

    def closed_with(self, exc: Exception) -> None:
        """Record, rather than raise, an error a transport raised while it
        closed after the body finished. mcp 1.29.1/1.30.0 stdio_client: when
        a late response to a timed-out request arrives just as the session
        closes, its stdout reader fails with anyio.BrokenResourceError (it
        catches only ClosedResourceError); the server has been waited for by
        then."""
        self.close_errors.append(describe(exc))
        log(f"error while closing: {describe(exc)}")


def find_child(command: str) -> int | None:
    """The pid of our direct child running `command` (stdio_client does not
    expose the process it spawned)."""
    me = os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="utf-8", errors="replace") as f:
                stat = f.read()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        # The command name (in parentheses) may hold spaces and ')'; the
        # fields after the last ')' are: state, ppid, ...
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 1 and int(fields[1]) == me and os.fsdecode(argv[0]) == command:
            return int(name)
    return None


def db_count(db: str, query: str) -> tuple[int, str]:
    """Run the plan's count query read-only. Before the server has created
    the file or its tables this fails; the error is returned with count 0."""
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5.0)
    except sqlite3.Error as exc:
        return 0, str(exc)
    try:
        row = conn.execute(query).fetchone()
        return (int(row[0]) if row and row[0] is not None else 0), ""
    except sqlite3.Error as exc:
        return 0, str(exc)
    finally:
        conn.close()


async def wait_for_count(db: str, query: str, done: anyio.Event) -> dict[str, Any]:
    """Poll `query` every ~20 ms until it counts > 0, `done` is set, or the
    deadline passes; says which, with the last count and database error."""
    out: dict[str, Any] = {"count": 0, "dbError": "", "attemptEndedFirst": False, "pollTimedOut": False}
    with anyio.move_on_after(KILL_POLL_DEADLINE_S):
        while True:
            out["count"], out["dbError"] = await anyio.to_thread.run_sync(db_count, db, query)
            if out["count"] > 0 or done.is_set():
                out["attemptEndedFirst"] = out["count"] == 0
                return out
            with anyio.move_on_after(KILL_POLL_INTERVAL_S):
                await done.wait()
    out["pollTimedOut"] = True
    return out
