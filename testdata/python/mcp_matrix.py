"""Shared parts of the Python matrix clients (client.py, graph.py).

A matrix client reads a plan (JSON file named on the command line), runs one
scenario of one logical `charge` call, and prints exactly one JSON report as
the last line of stdout. Exit 0 when the run was carried out, whatever the
tool answered; exit 2 on a usage error or an unexpected exception. Logs, and
the stdio server's stderr, go to stderr.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sqlite3
import sys
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from importlib import metadata
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
from anyio.abc import ObjectSendStream
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.message import SessionMessage
from mcp.types import CONNECTION_CLOSED

# Where mcp-outbox reports on a recorded call in a result's _meta.
CALL_META = "io.github.mcp-outbox/call"

# The major version of the installed SDK. These programs run under mcp 1.29.1
# and 1.30.0 (the seed and latest venvs, which LangGraph's adapters keep below
# 2) and under mcp 2.3.0 (the newest venv, client.py only); where the two
# majors differ, the code below says how.
MCP_MAJOR = int(metadata.version("mcp").split(".")[0])

if MCP_MAJOR >= 2:
    # mcp 2.0 renamed McpError to MCPError (mcp.shared.exceptions); the old
    # name is gone, not aliased.
    from mcp import Client
    from mcp.shared.exceptions import MCPError
    from mcp.types import REQUEST_TIMEOUT

    # mcp 2.3.0 (shared/jsonrpc_dispatcher.py, send_raw_request): a request
    # that outlives its read timeout raises MCPError REQUEST_TIMEOUT (-32001,
    # "Request 'tools/call' timed out", the TypeScript SDK's code) and first
    # sends the courtesy notifications/cancelled, which 1.x never sent. Over
    # Streamable HTTP at protocol 2026-07-28 the transport turns that
    # notification into aborting the request's own POST instead.
    TIMEOUT_CODE = REQUEST_TIMEOUT
else:
    from mcp.shared.exceptions import McpError as MCPError

    # mcp 1.29.1 and 1.30.0 (shared/session.py, send_request): a request that
    # outlives its read timeout raises McpError with code
    # httpx.codes.REQUEST_TIMEOUT, i.e. 408 (not the TypeScript SDK's
    # -32001), and sends no notifications/cancelled; the server's late
    # response is dropped as an unknown request id.
    TIMEOUT_CODE = 408

# In both majors a transport that ends (the stdio server died) fails every
# pending request with CONNECTION_CLOSED (-32000, "Connection closed").

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
    if isinstance(first, MCPError):
        code = first.error.code
        kind = {TIMEOUT_CODE: "timeout", CONNECTION_CLOSED: "closed"}.get(code, "other")
        return {"errorKind": kind, "error": first.error.message, "errorCode": code}
    if isinstance(first, (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, BrokenPipeError, ConnectionError)):
        return {"errorKind": "closed", "error": describe(exc)}
    if isinstance(first, TimeoutError):
        return {"errorKind": "timeout", "error": describe(exc)}
    return {"errorKind": "other", "error": describe(exc)}


def read_timeout(ms: int) -> Any:
    """A call_tool read_timeout_seconds of ms milliseconds: mcp 1.x takes a
    timedelta, mcp 2.0 changed it to a float of seconds."""
    return ms / 1000 if MCP_MAJOR >= 2 else timedelta(milliseconds=ms)


def wire(model: Any) -> dict[str, Any]:
    """A result as it was on the wire (isError, structuredContent, _meta, ...).
    mcp 2.0 renamed the models' attributes to snake_case (is_error,
    structured_content, protocol_version, server_info) and keeps the
    camelCase names as aliases only; the wire form reads the same in 1.x and
    2.x."""
    return model.model_dump(by_alias=True, mode="json", exclude_none=True)


def texts_of(result: dict[str, Any]) -> list[str]:
    """The texts of a result's content (its wire form)."""
    return [c["text"] for c in result.get("content") or [] if c.get("type") == "text" and isinstance(c.get("text"), str)]


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


def result_fields(result: Any, plan: dict[str, Any]) -> dict[str, Any]:
    """The report fields for an attempt that got a tools/call result (a
    CallToolResult of either major)."""
    doc = wire(result)
    texts = texts_of(doc)
    out: dict[str, Any] = {"errorKind": "", **call_fields(doc.get("_meta"))}
    if doc.get("isError"):
        out["toolError"] = "\n".join(texts)
        out["chargeId"] = 0
    else:
        out["chargeId"] = charge_id(doc.get("structuredContent"), texts, plan.get("chargeIdField", "charge_id"))
    return out


def negotiated(session: Any, init: Any) -> dict[str, Any]:
    """What the connection negotiated: protocolVersion, server, and how
    (negotiation: "initialize" or "server/discover").

    mcp 1.x: session is a ClientSession and init the InitializeResult. mcp
    2.x: session is an mcp.Client, whose default mode "auto" first probes
    server/discover (protocol 2026-07-28, no handshake, no session) and falls
    back to initialize when the server does not speak it; init is then the
    DiscoverResult or the InitializeResult."""
    if MCP_MAJOR >= 2:
        info = session.server_info
        return {
            "protocolVersion": session.protocol_version,
            "server": wire(info) if info is not None else None,
            "negotiation": "server/discover" if session.session.discover_result is not None else "initialize",
        }
    doc = wire(init)
    return {"protocolVersion": doc.get("protocolVersion"), "server": doc.get("serverInfo"), "negotiation": "initialize"}


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
        # Streamable HTTP under mcp 2.x: each HTTP exchange, and the session
        # id the server gave (none when the connection runs stateless).
        self.exchanges: list[str] = []
        self.session_id: str | None = None

    def note(self, report: dict[str, Any]) -> None:
        report["sent"] = self.sent
        report["cancelledSent"] = "notifications/cancelled" in self.sent
        report["lateResponses"] = len(self.late)
        report["closeErrors"] = self.close_errors
        if self.exchanges:
            report["http"] = self.exchanges

    async def message_handler(self, message: Any) -> None:
        # mcp 1.29.1/1.30.0 (shared/session.py, _handle_response) hand a
        # response whose request already timed out to the message handler as
        # RuntimeError("Received response with an unknown request ID: ...").
        # mcp 2.x drops it in the dispatcher instead: see LateResponses.
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
                    # mcp 1.x wraps the message in a RootModel (.root); mcp
                    # 2.0 made JSONRPCMessage a plain union of the models.
                    inner = getattr(msg.message, "root", msg.message)
                    self.sent.append(getattr(inner, "method", None) or "response")
                    try:
                        # The SessionMessage goes on whole: mcp 2.x puts the
                        # per-request HTTP headers in its metadata.
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
    async def session(self, read: Any, write: ObjectSendStream[SessionMessage]) -> AsyncIterator[tuple[ClientSession, Any]]:
        """mcp 1.x: an initialized ClientSession on the transport's streams."""
        async with self.recording(write) as rec, ClientSession(read, rec, message_handler=self.message_handler) as session:
            init = await session.initialize()
            yield session, init

    @asynccontextmanager
    async def client(self, transport: Any) -> AsyncIterator[tuple[Any, Any]]:
        """mcp 2.x: a connected mcp.Client on the transport (an async context
        manager of (read, write), as the SDK's stdio_client and
        streamable_http_client are), its writes recorded.

        mcp.Client is 2.0's high-level client; its default mode "auto" is the
        SDK's default negotiation (ClientSession.initialize() alone would
        force the pre-2026 handshake). call_tool and list_tools take the same
        arguments as 1.x's ClientSession's, the timeout aside (read_timeout)."""

        @asynccontextmanager
        async def recorded() -> AsyncIterator[tuple[Any, ObjectSendStream[SessionMessage]]]:
            async with transport as streams:
                read, write = streams[0], streams[1]
                async with self.recording(write) as rec:
                    yield read, rec

        with LateResponses(self.late):
            async with Client(recorded(), message_handler=self.message_handler) as client:
                session = client.session
                yield client, session.discover_result or session.initialize_result

    @asynccontextmanager
    async def stdio(self, plan: dict[str, Any]) -> AsyncIterator[tuple[Any, Any]]:
        """Spawn the plan's server and yield a connected session (mcp 1.x: a
        ClientSession and its InitializeResult, which graph.py relies on; mcp
        2.x: see client()). On exit stdio_client closes the server's stdin and
        waits up to 2 s for it to exit (then SIGTERM, then SIGKILL): mcp
        1.29.1/1.30.0 and 2.3.0 client/stdio."""
        finished = False
        try:
            transport = stdio_client(stdio_params(plan), errlog=sys.stderr)
            if MCP_MAJOR >= 2:
                connected = self.client(transport)
            else:
                connected = self._session_on(transport)
            async with connected as pair:
                yield pair
                finished = True
        except Exception as exc:
            if not finished:
                raise
            self.closed_with(exc)

    @asynccontextmanager
    async def _session_on(self, transport: Any) -> AsyncIterator[tuple[ClientSession, Any]]:
        async with transport as (read, write), self.session(read, write) as pair:
            yield pair

    @asynccontextmanager
    async def http(self, url: str) -> AsyncIterator[tuple[Any, Any, Callable[[], str | None]]]:
        """A connected session over Streamable HTTP, and a function that
        returns its session id. On exit the transport DELETEs the session
        (terminate_on_close) when there is one.

        mcp 1.29.1/1.30.0: streamablehttp_client is deprecated in favour of
        streamable_http_client, which yields (read, write, get_session_id);
        its default httpx client has MCP's timeouts (30 s, read 300 s).
        mcp 2.x: streamable_http_client yields (read, write) only, on httpx2
        (httpx's successor); the session id is read off the responses by an
        event hook of our own httpx2 client, with the timeouts of the SDK's
        default one (shared/_httpx_utils.py: 30 s, read 300 s)."""
        finished = False
        try:
            if MCP_MAJOR >= 2:
                import httpx2

                # Each request as "POST tools/call", completed by " -> STATUS"
                # once its response headers came. At 2026-07-28 a timed-out
                # call's POST is aborted, not answered (the
                # notifications/cancelled in `sent` never goes out).
                pending: dict[int, int] = {}

                async def sending(request: Any) -> None:
                    pending[id(request)] = len(self.exchanges)
                    self.exchanges.append(f"{request.method} {posted_method(request)}".rstrip())

                async def answered(response: Any) -> None:
                    i = pending.pop(id(response.request), None)
                    if i is not None:
                        self.exchanges[i] += f" -> {response.status_code}"
                    self.session_id = response.headers.get("mcp-session-id") or self.session_id

                async with httpx2.AsyncClient(timeout=httpx2.Timeout(30.0, read=300.0)) as http_client:
                    http_client.event_hooks["request"].append(sending)
                    http_client.event_hooks["response"].append(answered)
                    transport = streamable_http_client(url, http_client=http_client, terminate_on_close=True)
                    async with self.client(transport) as (client, init):
                        yield client, init, lambda: self.session_id
                        finished = True
            else:
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


def posted_method(request: Any) -> str:
    """The JSON-RPC method an HTTP request carries: its Mcp-Method header
    (mcp 2.x sets it at 2026-07-28), else the body's ("response" for an
    answer); "" for a GET or DELETE."""
    if request.headers.get("mcp-method"):
        return request.headers["mcp-method"]
    try:
        body = json.loads(request.content or b"null")
    except Exception:  # noqa: BLE001 - a streamed or odd body: say nothing
        return ""
    if isinstance(body, dict):
        return body.get("method") or "response"
    return ""


class LateResponses(logging.Handler):
    """mcp 2.x (shared/jsonrpc_dispatcher.py, _resolve_pending) drops a
    response whose request it has given up on with only a debug log line,
    "dropping response for unknown/late request id %r"; 1.x handed it to the
    message handler. While in use, this handler collects those lines."""

    LOGGER = "mcp.shared.jsonrpc_dispatcher"
    PREFIX = "dropping response for unknown/late request id"

    def __init__(self, into: list[str]) -> None:
        super().__init__(logging.DEBUG)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        if isinstance(record.msg, str) and record.msg.startswith(self.PREFIX):
            text = record.getMessage()
            self.into.append(text)
            log(f"late response: {text[:300]}")

    def __enter__(self) -> LateResponses:
        logger = logging.getLogger(self.LOGGER)
        self.saved_level = logger.level
        # The logger's own level decides whether debug records are made at
        # all. Propagated to the root logger, which has no handler here, they
        # reach only logging's last resort, which prints WARNING and above.
        logger.setLevel(logging.DEBUG)
        logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logger = logging.getLogger(self.LOGGER)
        logger.removeHandler(self)
        logger.setLevel(self.saved_level)


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
