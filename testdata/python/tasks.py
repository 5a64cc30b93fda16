"""Tasks client, 2025-11-25 generation: the Python SDK's experimental Tasks
client (mcp 1.x: session.experimental.call_tool_as_task, get_task,
get_task_result, cancel_task) runs ONE case of ONE logical `charge` call and
reports what the SDK did. The plan and the report are those of
testdata/ext-tasks/tasks.mjs (see there for the cases); the Go harness
(cmd/mcp-outbox/e2e/tasks_interop_test.go) judges. This program asserts nothing
about charges.

Usage: python tasks.py PLAN_FILE

mcp 1.x speaks 2025-11-25 Tasks only (mcp 2.0 removed them). Unlike the
TypeScript clients, call_tool_as_task always asks for a task (params.task,
with a ttl of 60 s by default) whatever the tool declares; the server may
still answer with a plain result, which the SDK then fails to read as a
CreateTaskResult: the case reports that as no task.

Exit status: 0 the case was carried out (whatever the server answered), 2 a
usage error or an unexpected exception, 3 the plan's deadline passed. Either
way the last stdout line is the JSON report.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
import warnings
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from importlib import metadata
from typing import Any

import anyio
import httpx
import mcp_matrix as mm
from mcp import ClientSession
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult

# mcp 1.30 warns on every use of session.experimental that Tasks go away in
# 2.0; that is known (see the docstring), and the warning is noise in the log.
warnings.filterwarnings("ignore", message="The experimental tasks API is deprecated", category=DeprecationWarning)

PROTOCOL = "2025-11-25"
CASES = ("complete", "lost-handle", "lost-handle-nokey", "cancel", "crash", "other-principal")
TERMINAL = ("completed", "failed", "cancelled")
POLL_EVERY_S = 0.02


class Conn:
    def __init__(self, who: str, session: ClientSession, pid: int | None) -> None:
        self.who, self.session, self.pid = who, session, pid


class Run:
    """One case: its plan, its report, and the connections it opens."""

    def __init__(self, plan: dict[str, Any], report: dict[str, Any]) -> None:
        self.plan, self.report, self.conns = plan, report, 0

    @asynccontextmanager
    async def connect(self, token: str | None = None) -> AsyncIterator[Conn]:
        """A connection, initialized and with its tools listed."""
        self.conns += 1
        who = f"conn{self.conns}"
        plan = self.plan
        if plan.get("url"):
            headers = {"Authorization": f"Bearer {token}"} if token else None
            async with (
                httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(30.0, read=300.0)) as http_client,
                streamable_http_client(plan["url"], http_client=http_client) as (read, write, _),
                ClientSession(read, write) as session,
            ):
                yield await self._ready(who, session, None)
        else:
            async with stdio_client(mm.stdio_params(plan)) as (read, write), ClientSession(read, write) as session:
                yield await self._ready(who, session, mm.find_child(plan["server"]["command"]))

    async def _ready(self, who: str, session: ClientSession, pid: int | None) -> Conn:
        init = await session.initialize()
        doc = mm.wire(init)
        self.report["protocolVersion"] = self.report["protocolVersion"] or doc.get("protocolVersion") or ""
        tasks = (doc.get("capabilities") or {}).get("tasks")
        if self.report["serverTasks"] is None:
            self.report["serverTasks"] = ((tasks or {}).get("requests") or {}).get("tools", {}).get("call") is not None
        tools = await session.list_tools()
        if not self.report["tools"]:
            self.report["tools"] = [t.name for t in tools.tools]
        where = f"HTTP {self.plan['url']}" if self.plan.get("url") else f"stdio pid {pid}"
        mm.log(f"{who}: connected ({where}), protocol {doc.get('protocolVersion')}, server tasks {json.dumps(tasks)}")
        return Conn(who, session, pid)

    def new_call(self, what: str) -> dict[str, Any]:
        c: dict[str, Any] = {"what": what, "kind": "", "taskId": "", "statuses": [], "status": "", "chargeId": 0, "toolError": "", "error": "", "_start": time.monotonic()}
        self.report["calls"].append(c)
        return c

    async def create(self, conn: Conn, c: dict[str, Any]) -> bool:
        """Makes the plan's call as a task; false (and report.noTask) when
        none came back."""
        plan = self.plan
        meta = {"idempotencyKey": plan["key"]} if plan.get("key") else None
        try:
            created = await conn.session.experimental.call_tool_as_task(plan["tool"], plan.get("arguments") or {}, meta=meta)
        except Exception as exc:  # noqa: BLE001 - reported, whatever it is
            c["kind"] = "error"
            set_error(c, exc)
            self.report["noTask"] = (
                f"tools/call failed: {c['error']}; the initialize result lists capabilities.tasks.requests.tools.call: {self.report['serverTasks']}"
            )
            end_call(c)
            return False
        c["kind"], c["taskId"] = "task", created.task.taskId
        seen(c, created.task.status)
        return True

    async def poll(self, conn: Conn, c: dict[str, Any]) -> None:
        """Reads the task until it is terminal, then its result if completed."""
        x = conn.session.experimental
        while True:
            task = await x.get_task(c["taskId"])
            seen(c, task.status)
            if task.status in TERMINAL:
                c["status"] = task.status
                if task.status == "completed":
                    result = mm.wire(await x.get_task_result(c["taskId"], CallToolResult))
                    texts = mm.texts_of(result)
                    if result.get("isError"):
                        c["toolError"] = "\n".join(texts)
                    else:
                        c["chargeId"] = mm.charge_id(result.get("structuredContent"), texts, self.plan.get("chargeIdField", "charge_id"))
                return
            await anyio.sleep(max(POLL_EVERY_S, (task.pollInterval or 0) / 1000))


def seen(c: dict[str, Any], status: str) -> None:
    if not c["statuses"] or c["statuses"][-1] != status:
        c["statuses"].append(status)


def set_error(c: dict[str, Any], exc: BaseException) -> None:
    fields = mm.error_fields(exc)
    c["error"] = fields.get("error", mm.describe(exc))
    if isinstance(fields.get("errorCode"), int):
        c["errorCode"] = fields["errorCode"]


def end_call(c: dict[str, Any]) -> None:
    if "_start" in c:
        c["ms"] = round((time.monotonic() - c.pop("_start")) * 1000)
        mm.log(f"{c['what']}: {c['kind'] or '-'} {c['taskId']} statuses {c['statuses']} final {c['status'] or '-'} charge {c['chargeId']} {c['error']}")


async def run_complete(r: Run) -> None:
    async with r.connect() as conn:
        c = r.new_call("call (slow: becomes a task)")
        if await r.create(conn, c):
            await r.poll(conn, c)
            end_call(c)


async def run_lost_handle(r: Run) -> None:
    """See testdata/ext-tasks/tasks.mjs (the second connection is opened
    first; plan.keepFirstOpen). Closing a session cancels nothing in mcp 1.x.

    The second connection is entered first, outside the first: anyio lets a
    task leave its cancel scopes (each connection's task group) only in the
    reverse order of entering them, so the first connection can close while
    the second stays open only if it was entered last."""
    keep = bool(r.plan.get("keepFirstOpen"))
    async with r.connect() as second, AsyncExitStack() as first_scope:
        first = await first_scope.enter_async_context(r.connect())
        c1 = r.new_call("call 1 (its handle is then lost)")
        if not await r.create(first, c1):
            return
        c1["status"] = "dropped"
        end_call(c1)
        if not keep:
            await first_scope.aclose()
        what = f"call 2, the same call{' and key' if r.plan.get('key') else ' without a key'} from the second connection"
        c2 = r.new_call(what + (" (the first still open)" if keep else ""))
        if await r.create(second, c2):
            await first_scope.aclose()
            await r.poll(second, c2)
        end_call(c2)


async def run_cancel(r: Run) -> None:
    async with r.connect() as conn:
        c = r.new_call("call, cancelled at once")
        if not await r.create(conn, c):
            return
        try:
            task = await conn.session.experimental.cancel_task(c["taskId"])
            c["cancelSent"] = True
            seen(c, task.status)
            await r.poll(conn, c)
        except Exception as exc:  # noqa: BLE001
            set_error(c, exc)
        end_call(c)


async def run_crash(r: Run) -> None:
    plan = r.plan
    c = r.new_call("call (the server is SIGKILLed while its task runs)")
    async with r.connect() as first:
        if not await r.create(first, c):
            return
        with open(mm.need(plan, "createdFile"), "w", encoding="utf-8") as f:
            json.dump({"taskId": c["taskId"], "pid": first.pid}, f)
        mm.log(f"task {c['taskId']} created; waiting for {plan['resumeFile']}")
        while not os.path.exists(mm.need(plan, "resumeFile")):
            await anyio.sleep(POLL_EVERY_S)
    c["what"] += "; polled from a new connection"
    async with r.connect() as second:
        try:
            await r.poll(second, c)
        except Exception as exc:  # noqa: BLE001
            set_error(c, exc)
        end_call(c)


async def run_other_principal(r: Run) -> None:
    plan = r.plan
    async with r.connect(mm.need(plan, "token")) as owner, r.connect(mm.need(plan, "otherToken")) as other:
        c = r.new_call("call by the owner")
        if not await r.create(owner, c):
            return
        o: dict[str, Any] = {"status": "", "error": ""}
        try:
            o["status"] = (await other.session.experimental.get_task(c["taskId"])).status
        except Exception as exc:  # noqa: BLE001
            set_error(o, exc)
        r.report["otherPrincipal"] = o
        try:
            await r.poll(owner, c)
        except Exception as exc:  # noqa: BLE001
            set_error(c, exc)
        end_call(c)


RUNS = {
    "complete": run_complete,
    "lost-handle": run_lost_handle,
    "lost-handle-nokey": run_lost_handle,
    "cancel": run_cancel,
    "crash": run_crash,
    "other-principal": run_other_principal,
}


async def run(plan: dict[str, Any], report: dict[str, Any]) -> bool:
    """Runs the case; false when the plan's deadline passed."""
    with anyio.move_on_after(plan.get("deadlineMs", 60000) / 1000) as scope:
        await RUNS[plan["case"]](Run(plan, report))
    return not scope.cancelled_caught


def main() -> None:
    report: dict[str, Any] = {
        "client": "python-mcp-tasks",
        "versions": {"python": sys.version.split()[0], "mcp": metadata.version("mcp")},
        "protocolVersion": "",
        "serverTasks": None,
        "tools": [],
        "case": "",
        "calls": [],
        "noTask": "",
        "error": "",
    }
    code = 0
    try:
        if len(sys.argv) != 2:
            raise mm.UsageError("usage: tasks.py PLAN_FILE")
        with open(sys.argv[1], encoding="utf-8") as f:
            plan = json.load(f)
        if plan.get("case") not in CASES:
            raise mm.UsageError(f"plan.case {plan.get('case')!r}: this client runs {', '.join(CASES)}")
        if plan.get("protocol", PROTOCOL) != PROTOCOL:
            raise mm.UsageError(f"plan.protocol {plan['protocol']!r}: mcp 1.x's experimental Tasks are {PROTOCOL} only")
        if mm.MCP_MAJOR >= 2:
            raise mm.UsageError(f"mcp {metadata.version('mcp')}: Tasks were removed in mcp 2.0; run this under mcp 1.x")
        plan.setdefault("tool", "charge")
        plan["scenario"] = plan["case"]  # what mm's messages name
        report["case"], report["keyed"] = plan["case"], bool(plan.get("key"))
        report["transport"] = "http" if plan.get("url") else "stdio"
        if not anyio.run(run, plan, report):
            report["error"] = f"deadline: the case took more than {plan.get('deadlineMs', 60000)} ms"
            code = 3
    except mm.UsageError as exc:
        report["error"] = str(exc)
        code = 2
    except BaseException as exc:  # noqa: BLE001 - the report must be printed whatever happened
        traceback.print_exception(exc, file=sys.stderr)
        report["error"] = mm.describe(exc)
        code = 2
    for c in report["calls"]:
        end_call(c)
    sys.stdout.write(json.dumps(report, default=str) + "\n")
    sys.stdout.flush()
    sys.exit(code)


if __name__ == "__main__":
    main()
