"""Matrix client: LangGraph + langchain-mcp-adapters, scenario framework-retry.

Usage: python graph.py PLAN_FILE

A StateGraph with one node, added with the DEFAULT RetryPolicy() (its
default retry_on retries ConnectionError). The node calls the charge tool
through the adapter, then raises ConnectionError on every node attempt
before plan.nodeAttempts, as a transport failure after the tool returned
would; the last attempt returns normally. Each node attempt's tool call is
one reported attempt.

Transport: stdio (plan.server: one server process and one MCP session for the
whole graph, tools from load_mcp_tools(session)), or Streamable HTTP when
plan.url is set (tools from load_mcp_tools(None, connection=...): the adapter
opens a new MCP session for every tool call).

The key (plan.key). langchain-mcp-adapters 0.3.2 cannot put _meta on a
tool call: its interceptor request (interceptors.MCPToolCallRequest) carries
only name, args and headers, and the adapter's own call is
session.call_tool(name, args, progress_callback=...) with no meta
(tools.py, execute_tool). What it offers instead:
  - HTTP: an interceptor may override headers, which the adapter applies to
    the session it opens for the call; the key goes in the Idempotency-Key
    header (keyVia "header").
  - stdio: no headers. An interceptor may skip the adapter's handler; ours
    then makes the call itself on the session, with _meta.idempotencyKey
    (keyVia "interceptor-call": the adapter did not send the key).
Without a key, the interceptor only passes the call on.
"""

from __future__ import annotations

from typing import Any, TypedDict

from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool
from langchain_mcp_adapters.interceptors import MCPToolCallRequest
from langchain_mcp_adapters.server_info import load_mcp_server_info
from langchain_mcp_adapters.tools import load_mcp_tools
from langgraph.graph import END, START, StateGraph
from langgraph.types import RetryPolicy
from mcp import ClientSession
from mcp.types import CallToolResult

import mcp_matrix as mm


class Observer:
    """A tool-call interceptor (the adapter's hook around every MCP call):
    sends the key the way the transport allows and keeps the raw
    CallToolResult, whose _meta the ToolMessage no longer carries."""

    def __init__(self, key: str, session: ClientSession | None) -> None:
        self.key = key
        self.session = session
        self.last: CallToolResult | None = None

    async def __call__(self, request: MCPToolCallRequest, handler: Any) -> Any:
        self.last = None
        if not self.key:
            result = await handler(request)
        elif self.session is not None:
            result = await self.session.call_tool(request.name, request.args, meta={"idempotencyKey": self.key})
        else:
            result = await handler(request.override(headers={"Idempotency-Key": self.key}))
        if isinstance(result, CallToolResult):
            self.last = result
        return result


class State(TypedDict):
    chargeId: int


def tool_texts(msg: ToolMessage) -> list[str]:
    if isinstance(msg.content, str):
        return [msg.content]
    return [b["text"] if isinstance(b, dict) else str(b) for b in msg.content if not isinstance(b, dict) or b.get("type") == "text"]


def build_graph(tool: BaseTool, plan: dict[str, Any], report: dict[str, Any], observer: Observer) -> Any:
    node_attempts = int(plan.get("nodeAttempts") or 3)
    field = plan.get("chargeIdField", "charge_id")
    calls = 0

    async def charge_node(state: State) -> dict[str, Any]:
        nonlocal calls
        calls += 1
        n = calls
        watch = mm.Stopwatch()
        try:
            msg = await tool.ainvoke({"type": "tool_call", "id": f"charge-{n}", "name": tool.name, "args": plan.get("arguments") or {}})
        except Exception as exc:
            # A transport failure: recorded, then left to the retry policy.
            entry = mm.error_fields(exc)
            entry = {"what": f"node attempt {n}: {mm.outcome(entry)}", **entry, "ms": watch.ms(), "nodeError": mm.describe(exc)}
            report["attempts"].append(entry)
            mm.log(entry["what"])
            raise
        texts = tool_texts(msg)
        # replayed: from the raw result the interceptor saw; the ToolMessage
        # keeps only content and structuredContent (artifact), not _meta.
        entry: dict[str, Any] = {"what": "", "errorKind": "", **mm.call_fields(observer.last.meta if observer.last else None)}
        if msg.status == "error":
            # handle_tool_errors=True (the default): an isError result comes
            # back as a ToolMessage with status "error", not an exception.
            entry.update(toolError="\n".join(texts), chargeId=0)
        else:
            structured = (msg.artifact or {}).get("structured_content") if isinstance(msg.artifact, dict) else None
            entry["chargeId"] = mm.charge_id(structured, texts, field)
        entry["ms"] = watch.ms()
        entry["what"] = f"node attempt {n}: {mm.outcome(entry)}"
        report["attempts"].append(entry)
        if n < node_attempts:
            err = ConnectionError(f"connection lost after the tool returned (node attempt {n} of {node_attempts})")
            entry["nodeError"] = f"ConnectionError: {err}"
            entry["what"] += f"; node raised {entry['nodeError']}"
            mm.log(entry["what"])
            raise err
        mm.log(entry["what"])
        return {"chargeId": entry["chargeId"]}

    graph = StateGraph(State)
    graph.add_node("charge", charge_node, retry_policy=RetryPolicy())
    graph.add_edge(START, "charge")
    graph.add_edge("charge", END)
    return graph.compile()


def note_tools(report: dict[str, Any], tools: list[BaseTool]) -> None:
    report["tools"] = [t.name for t in tools]
    # The annotations (idempotentHint etc.) as the adapter exposes them.
    report["toolMetadata"] = {t.name: t.metadata for t in tools}


async def run_graph(tools: list[BaseTool], plan: dict[str, Any], report: dict[str, Any], observer: Observer) -> None:
    note_tools(report, tools)
    tool = next((t for t in tools if t.name == plan["tool"]), None)
    if tool is None:
        raise RuntimeError(f"tool {plan['tool']!r} not among {report['tools']}")
    graph = build_graph(tool, plan, report, observer)
    watch = mm.Stopwatch()
    try:
        final = await graph.ainvoke({"chargeId": 0})
    except Exception as exc:  # noqa: BLE001 - the policy gave up: what the framework did, reported
        report["graphError"] = mm.describe(exc)
        mm.log(f"graph failed: {report['graphError']}")
    else:
        report["graphResult"] = final
    report["graphMs"] = watch.ms()


async def run(plan: dict[str, Any], report: dict[str, Any]) -> None:
    if plan["scenario"] != "framework-retry":
        raise mm.UsageError(f"scenario {plan['scenario']!r} not supported (supported: framework-retry)")
    key = plan.get("key") or ""
    wire = mm.Wire()
    if plan.get("url"):
        report["transport"] = "http"
        report["keyVia"] = "header" if key else ""
        connection: Any = {"transport": "streamable_http", "url": plan["url"]}
        report["protocolVersion"] = (await load_mcp_server_info(None, connection=connection)).protocolVersion
        observer = Observer(key, None)
        tools = await load_mcp_tools(None, connection=connection, tool_interceptors=[observer])
        await run_graph(tools, plan, report, observer)
        return
    report["transport"] = "stdio"
    report["keyVia"] = "interceptor-call" if key else ""
    try:
        async with wire.stdio(plan) as (session, init):
            report["protocolVersion"] = init.protocolVersion
            observer = Observer(key, session)
            tools = await load_mcp_tools(session, tool_interceptors=[observer])
            await run_graph(tools, plan, report, observer)
    finally:
        wire.note(report)


if __name__ == "__main__":
    mm.main("python-langgraph", ("mcp", "langgraph", "langchain-mcp-adapters", "langchain-core"), run)
