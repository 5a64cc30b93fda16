"""Matrix client: the official Python MCP SDK (`mcp`) against one server.

Usage: python client.py PLAN_FILE

Scenarios (plan.scenario):
  timeout       stdio; attempt 1 with timeoutMs, attempt 2 on the same
                connection with retryTimeoutMs
  crash         stdio; attempt 1 in the background, SIGKILL the server once
                plan.killWhen counts > 0 in plan.db, then a new server and a
                new connection for attempt 2
  http-session  Streamable HTTP at plan.url; attempt 1 with timeoutMs,
                attempt 2 on the same session with retryTimeoutMs

With plan.key, every attempt carries it in params._meta.idempotencyKey.
Prints one JSON report as the last line of stdout (see mcp_matrix.py).

Runs under mcp 1.x (ClientSession, initialize: protocol 2025-11-25 at most)
and mcp 2.x (mcp.Client with its default negotiation: server/discover for
protocol 2026-07-28 first, initialize when the server does not answer it);
mcp_matrix.py holds the differences.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import anyio

import mcp_matrix as mm


async def attempt(session: Any, plan: dict[str, Any], n: int, timeout_ms: int) -> dict[str, Any]:
    """One charge. session: mcp 1.x's ClientSession or mcp 2.x's Client (see
    mm.Wire), whose call_tool take the same arguments."""
    key = plan.get("key") or ""
    watch = mm.Stopwatch()
    try:
        # mcp 1.29.1, 1.30.0 and 2.3.0 all take call_tool(..., meta=...) and
        # put it in params._meta (1.x: RequestParams.Meta allows extra keys;
        # 2.x: RequestParamsMeta is an open TypedDict). mcp 2.x adds its own
        # entries beside it on a 2026-07-28 connection (protocol version,
        # client info and capabilities), none on a 2025-11-25 one.
        result = await session.call_tool(
            plan["tool"],
            plan.get("arguments") or {},
            read_timeout_seconds=mm.read_timeout(timeout_ms),
            meta={"idempotencyKey": key} if key else None,
        )
    except Exception as exc:  # noqa: BLE001 - reported, not judged
        entry = mm.error_fields(exc)
    else:
        entry = mm.result_fields(result, plan)
    entry = {"what": f"attempt {n} (timeout {timeout_ms} ms): {mm.outcome(entry)}", **entry, "ms": watch.ms()}
    mm.log(entry["what"])
    return entry


def note_session(report: dict[str, Any], session: Any, init: Any, tools: Any) -> None:
    report.update(mm.negotiated(session, init))
    report["tools"] = [t.name for t in tools.tools]


async def run_timeout(plan: dict[str, Any], report: dict[str, Any], wire: mm.Wire) -> None:
    async with wire.stdio(plan) as (session, init):
        note_session(report, session, init, await session.list_tools())
        report["attempts"].append(await attempt(session, plan, 1, plan.get("timeoutMs", 300)))
        report["attempts"].append(await attempt(session, plan, 2, plan.get("retryTimeoutMs", 30000)))


async def run_crash(plan: dict[str, Any], report: dict[str, Any], wire: mm.Wire) -> None:
    db, kill_when = mm.need(plan, "db"), mm.need(plan, "killWhen")
    retry_ms = plan.get("retryTimeoutMs", 30000)
    first: dict[str, Any] = {}
    async with wire.stdio(plan) as (session, init):
        note_session(report, session, init, await session.list_tools())
        command = plan["server"]["command"]
        pid = mm.find_child(command)
        if pid is None:
            raise RuntimeError(f"no child process of ours runs {command}")
        done = anyio.Event()

        async def attempt1() -> None:
            first.update(await attempt(session, plan, 1, retry_ms))
            done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(attempt1)
            report["kill"] = {"pid": pid, **await mm.wait_for_count(db, kill_when, done)}
            mm.log(f"SIGKILL server pid {pid}: {report['kill']}")
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                report["kill"]["alreadyGone"] = True
        # Attempt 1 has ended here: mcp (1.x McpError, 2.x MCPError) fails a
        # pending request with -32000 "Connection closed" once the stdio
        # server's stdout closes.
    report["attempts"].append(first)

    # What the stdio section of the spec says: start the server again, retry.
    async with wire.stdio(plan) as (session, _):
        await session.list_tools()
        report["attempts"].append(await attempt(session, plan, 2, retry_ms))


async def run_http(plan: dict[str, Any], report: dict[str, Any], wire: mm.Wire) -> None:
    async with wire.http(mm.need(plan, "url")) as (session, init, session_id):
        note_session(report, session, init, await session.list_tools())
        report["sessionId"] = session_id()
        report["attempts"].append(await attempt(session, plan, 1, plan.get("timeoutMs", 300)))
        report["attempts"].append(await attempt(session, plan, 2, plan.get("retryTimeoutMs", 30000)))


SCENARIOS = {"timeout": run_timeout, "crash": run_crash, "http-session": run_http}


async def run(plan: dict[str, Any], report: dict[str, Any]) -> None:
    scenario = SCENARIOS.get(plan["scenario"])
    if scenario is None:
        raise mm.UsageError(f"scenario {plan['scenario']!r} not supported (supported: {', '.join(SCENARIOS)})")
    wire = mm.Wire()
    try:
        await scenario(plan, report, wire)
    finally:
        wire.note(report)


if __name__ == "__main__":
    mm.main("python-mcp", ("mcp",), run)
