"""A real upstream MCP tool server for `mcp-outbox proxy`, in Python.

The same small payments ledger as testdata/ts-upstream/server.mjs (same tools,
schemas, environment, behaviour and ready line), written with the official
Python SDK's FastMCP (MCPServer in mcp 2) and the standard library's sqlite3 (or psycopg 3 on
PostgreSQL), on the contract module mcp_outbox_upstream.py beside it (schema/README.md). The Go tests run
it directly (cmd/mcp-outbox/e2e/upstream_contract_test.go) and behind the proxy.

Usage: python server.py   (stdio; Streamable HTTP with UPSTREAM_HTTP_PORT)

Environment:
  MCP_OUTBOX_DB                           the shared database (required): an SQLite
                                          file, or a postgres:// URL. The proxy
                                          creates the outbox tables first (and
                                          passes its --db on in this variable);
                                          this server never creates or alters them.
  UPSTREAM_COOPERATE                      "1" (default): record each claimed call's
                                          outcome and effects in the call's own
                                          transaction; "0": ignore the claim and
                                          write business rows only.
  UPSTREAM_CRASH_ONCE_FILE                if this file exists when a charge has
                                          committed: delete it, then SIGKILL this
                                          process before answering.
  UPSTREAM_CRASH_BEFORE_COMMIT_ONCE_FILE  the same, in the handler before the
                                          charge's transaction begins.
  UPSTREAM_CHARGE_DELAY_MS                make charge (and slow_charge after its own
                                          wait) wait this many milliseconds before its
                                          transaction, to simulate slow work. The wait
                                          does not end when the call is cancelled: the
                                          charge then still tries to commit, and the
                                          fence decides. Default 0.
  UPSTREAM_ANNOUNCE_CHARGES               "1": print "py-upstream: charge started"
                                          and "py-upstream: charge ended" to stderr
                                          around each charge, so that a test knows
                                          a forwarded call has arrived (or is done)
                                          without sleeping on a guess. Default off.
  UPSTREAM_HTTP_PORT                      serve Streamable HTTP (stateful sessions)
                                          on 127.0.0.1:PORT at /mcp instead of
                                          stdio; 0 picks a free port.

Once serving, it prints one line to stderr:
  py-upstream ready pid=<pid> cooperate=<0|1>[ url=http://127.0.0.1:<port>/mcp]

Requires the mcp package (1.29, 1.30 and 2.3 are tested), and psycopg 3 for
a postgres:// URL; nothing else beyond them. Where mcp 2 changed the API, a small shim below says how.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import socket
import sys
from importlib import metadata
from typing import Annotated, Any

import anyio
import anyio.lowlevel
from pydantic import BaseModel, ConfigDict, Field

from mcp.server.stdio import stdio_server
from mcp.types import CallToolResult, ToolAnnotations

MCP_MAJOR = int(metadata.version("mcp").split(".")[0])
if MCP_MAJOR >= 2:
    # mcp 2.0 renamed FastMCP to MCPServer, in mcp.server.mcpserver (Context
    # and tools.Tool moved with it); mcp.server.fastmcp is left only to raise
    # an ImportError that points at the migration guide. The constructor and
    # the decorators used here take the same arguments.
    from mcp.server.mcpserver import Context
    from mcp.server.mcpserver import MCPServer as FastMCP
    from mcp.server.mcpserver.tools import Tool
else:
    from mcp.server.fastmcp import Context, FastMCP
    from mcp.server.fastmcp.tools import Tool

from mcp_outbox_upstream import POSTGRES, Effect, SetupError, ToolFailure, Upstream, text_result

MAX_AMOUNT_CENTS = 1_000_000


def fail(msg: str) -> None:
    sys.stderr.write(f"py-upstream: {msg}\n")
    sys.stderr.flush()
    sys.exit(2)


db_path = os.environ.get("MCP_OUTBOX_DB", "")
if not db_path:
    fail("MCP_OUTBOX_DB is required: the SQLite file or postgres:// URL shared with mcp-outbox proxy")
cooperate_env = os.environ.get("UPSTREAM_COOPERATE", "1")
if cooperate_env not in ("0", "1"):
    fail(f"UPSTREAM_COOPERATE={json.dumps(cooperate_env)}: want 0 or 1")
cooperate = cooperate_env == "1"
crash_after_commit_file = os.environ.get("UPSTREAM_CRASH_ONCE_FILE", "")
crash_before_commit_file = os.environ.get("UPSTREAM_CRASH_BEFORE_COMMIT_ONCE_FILE", "")
http_port_env = os.environ.get("UPSTREAM_HTTP_PORT")
charge_delay_env = os.environ.get("UPSTREAM_CHARGE_DELAY_MS") or "0"
# A plain decimal: int() would also take " 5", "+5" and "5_0".
if not re.fullmatch(r"[0-9]+", charge_delay_env):
    fail(f"UPSTREAM_CHARGE_DELAY_MS={json.dumps(charge_delay_env)}: want a number of milliseconds")
charge_delay_ms = int(charge_delay_env)
announce_charges = os.environ.get("UPSTREAM_ANNOUNCE_CHARGES") == "1"

# --- database ---------------------------------------------------------------

try:
    up = Upstream(db_path, cooperate=cooperate)
except SetupError as e:
    fail(str(e))
db = up.conn

# Business tables: this server's own (the outbox tables are the proxy's),
# and the statements on them, in each store's dialect.
if up.dialect == POSTGRES:
    # Under an advisory lock: upstreams starting together (one per session
    # of a proxy serving HTTP) would otherwise race in CREATE TABLE IF NOT
    # EXISTS, which PostgreSQL does not make atomic.
    with db.transaction():
        db.execute("SELECT pg_advisory_xact_lock(hashtext('mcp-outbox py-upstream tables'))")
        db.execute(
            """CREATE TABLE IF NOT EXISTS charges (
                   id           BIGSERIAL PRIMARY KEY,
                   customer     TEXT   NOT NULL,
                   amount_cents BIGINT NOT NULL,
                   call_id      TEXT   NOT NULL,
                   created_at   BIGINT NOT NULL
               )"""
        )
        db.execute(
            """CREATE TABLE IF NOT EXISTS nicknames (
                   customer   TEXT PRIMARY KEY,
                   nickname   TEXT   NOT NULL,
                   updated_at BIGINT NOT NULL
               )"""
        )
    INSERT_CHARGE = (
        "INSERT INTO charges (customer, amount_cents, call_id, created_at) VALUES (%s, %s, %s, %s) RETURNING id"
    )
    # sum() of a BIGINT is a NUMERIC, which psycopg reads as a Decimal.
    BALANCE = "SELECT coalesce(sum(amount_cents), 0)::bigint, count(*) FROM charges WHERE customer = %s"
    SET_NICKNAME = """INSERT INTO nicknames (customer, nickname, updated_at) VALUES (%s, %s, %s)
                      ON CONFLICT (customer) DO UPDATE SET nickname = excluded.nickname, updated_at = excluded.updated_at"""
else:
    db.executescript(
        """
CREATE TABLE IF NOT EXISTS charges (
    id           INTEGER PRIMARY KEY,
    customer     TEXT    NOT NULL,
    amount_cents INTEGER NOT NULL,
    call_id      TEXT    NOT NULL,
    created_at   INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS nicknames (
    customer   TEXT PRIMARY KEY,
    nickname   TEXT    NOT NULL,
    updated_at INTEGER NOT NULL
);
"""
    )
    INSERT_CHARGE = "INSERT INTO charges (customer, amount_cents, call_id, created_at) VALUES (?, ?, ?, ?) RETURNING id"
    BALANCE = "SELECT coalesce(sum(amount_cents), 0), count(*) FROM charges WHERE customer = ?"
    SET_NICKNAME = """INSERT INTO nicknames (customer, nickname, updated_at) VALUES (?, ?, ?)
                      ON CONFLICT (customer) DO UPDATE SET nickname = excluded.nickname, updated_at = excluded.updated_at"""
LEDGER = "SELECT id, customer, amount_cents, call_id FROM charges ORDER BY id"


def crash_once(path: str, when: str) -> None:
    """SIGKILLs this process if path exists, deleting it first."""
    if path and os.path.exists(path):
        os.unlink(path)
        sys.stderr.write(f"py-upstream: crashing {when} (pid {os.getpid()})\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)


def request_meta(ctx: Context) -> dict[str, Any] | None:
    """The request's _meta as a dict, as it was on the wire.

    mcp 1.x: FastMCP hands it over as a pydantic model (RequestParams.Meta)
    that knows only progressToken; every other entry, the claim included, is
    kept as an extra, which model_dump returns with the rest (model_extra
    alone would lose progressToken).

    mcp 2.x: ctx.request_context.meta is a dict already, but a validated one
    (RequestParamsMeta, a TypedDict) that renames progressToken to
    progress_token; the request context keeps the raw params too, whose
    _meta is the wire's."""
    if MCP_MAJOR >= 2:
        meta = (ctx.request_context.params or {}).get("_meta")
        return dict(meta) if isinstance(meta, dict) else None
    meta = ctx.request_context.meta
    return None if meta is None else meta.model_dump()


def answer(result: dict[str, Any]) -> CallToolResult:
    # Returning a CallToolResult makes FastMCP pass it on untouched: a dict
    # or a model would be converted (structured output wrapped, text
    # generated), and the client would not get what was recorded. (mcp 2.x
    # adds resultType "complete" to the answer on a 2026-07-28 connection,
    # none on 2025-11-25: the protocol's envelope, not the tool's result, so
    # not recorded.) The result is in wire form (isError, structuredContent),
    # which model_validate reads in 1.x and 2.x alike.
    return CallToolResult.model_validate(result)


async def slow_work() -> None:
    """UPSTREAM_CHARGE_DELAY_MS, deaf to cancellation like server.mjs's: the
    shield keeps notifications/cancelled (which cancels the handler's scope)
    from ending it. The cancellation is delivered at the next await, and
    none comes before the (synchronous) transaction ends: a cancelled charge
    still tries to commit, and the fence decides."""
    if charge_delay_ms > 0:
        with anyio.CancelScope(shield=True):
            await anyio.sleep(charge_delay_ms / 1000)


def announce(what: str) -> None:
    if announce_charges:
        sys.stderr.write(f"py-upstream: charge {what}\n")
        sys.stderr.flush()


async def charge(ctx: Context, customer: str, amount_cents: int) -> CallToolResult:
    announce("started")
    try:
        return await charge_once(ctx, customer, amount_cents)
    finally:
        announce("ended")


async def charge_once(ctx: Context, customer: str, amount_cents: int) -> CallToolResult:
    crash_once(crash_before_commit_file, "before the commit of a charge")
    await slow_work()

    def work(tx, call_id: str, now: int):
        if amount_cents <= 0 or amount_cents > MAX_AMOUNT_CENTS:
            raise ToolFailure("amount out of range")
        (charge_id,) = tx.execute(INSERT_CHARGE, (customer, amount_cents, call_id, now)).fetchone()
        body = json.dumps({"customer": customer, "amount_cents": amount_cents, "charge_id": charge_id})
        return (
            text_result(
                f"charged {customer} {amount_cents} (charge {charge_id})",
                {"chargeId": charge_id, "customer": customer, "amount_cents": amount_cents},
            ),
            [
                Effect(
                    destination="payments",
                    method="POST",
                    path="/v1/charges",
                    headers={"Content-Type": "application/json"},
                    body=body,
                )
            ],
        )

    result = up.run_call(request_meta(ctx), work)
    if not result["isError"]:
        crash_once(crash_after_commit_file, "after the commit of a charge")
    # A call cancelled during the shielded slow work has been answered by
    # the SDK already ("Request cancelled"); returning normally would make it
    # answer again, and its assertion against that ends the whole server
    # (python-sdk#2416, in 1.29 and 1.30). Raising the pending cancellation
    # here takes the SDK's path for a cancelled handler instead. mcp 2.x no
    # longer needs it: its dispatcher never answers a request the client
    # cancelled and drops whatever the handler returns or raises
    # (shared/jsonrpc_dispatcher.py, _handle_request), so both paths end the
    # same there, and the call stays unanswered as the spec has it.
    await anyio.lowlevel.checkpoint_if_cancelled()
    return answer(result)


# --- the MCP server ---------------------------------------------------------

# The schemas of server.mjs's zod shapes. amount_cents is range-checked by
# the handler, not the schema: an out-of-range amount is a recorded tool
# error ('failed'), while a schema violation is answered by the SDK before
# the handler runs and records nothing. strict: no "12", 12.5 or true for
# an integer, as zod's z.number().int() has it.
Customer = Annotated[str, Field(min_length=1, description="Who to charge")]
AmountCents = Annotated[int, Field(strict=True, description=f"Amount in cents, 1 to {MAX_AMOUNT_CENTS}")]


# extra="forbid": additionalProperties false in the outputSchema, as zod's.
class ChargeOutput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    chargeId: int
    customer: str
    amount_cents: int


class BalanceOutput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    customer: str
    balance_cents: int
    charges: int


class _ToolWithOutputSchema(Tool):
    """A FastMCP tool that returns a CallToolResult itself and still
    advertises an outputSchema.

    FastMCP derives the outputSchema from the return annotation, and for
    Annotated[CallToolResult, Model] it validates every result's
    structuredContent against Model, a tool error's missing one included,
    which turns "amount out of range" into a validation error. So the tools
    are annotated plain CallToolResult (no schema, no validation) and the
    schema is declared here. Tool is a pydantic model; output_schema is a
    property of it (a cached_property in mcp 2.x) that FastMCP's tools/list
    reads."""

    declared_output_schema: dict[str, Any] | None = None

    @property
    def output_schema(self) -> dict[str, Any] | None:  # type: ignore[override]
        return self.declared_output_schema

    @classmethod
    def of(
        cls,
        fn: Any,
        *,
        name: str,
        description: str,
        output: type[BaseModel] | None = None,
        annotations: ToolAnnotations | None = None,
    ) -> Tool:
        base = Tool.from_function(fn, name=name, description=description, annotations=annotations)
        fields = {f: getattr(base, f) for f in Tool.model_fields}
        return cls(**fields, declared_output_schema=output.model_json_schema() if output else None)


async def charge_tool(customer: Customer, amount_cents: AmountCents, ctx: Context) -> CallToolResult:
    return await charge(ctx, customer, amount_cents)


async def slow_charge_tool(
    customer: Customer,
    amount_cents: AmountCents,
    delay_ms: Annotated[
        int, Field(strict=True, ge=0, le=600_000, description="Milliseconds to wait before charging")
    ],
    ctx: Context,
) -> CallToolResult:
    if (request_meta(ctx) or {}).get("progressToken") is not None:
        await ctx.report_progress(1, 2, f"waiting {delay_ms} ms before charging")
    # Not shielded: notifications/cancelled cancels this wait, and the
    # call then charges nothing (mcp 1.x has answered "Request cancelled";
    # mcp 2.x answers a cancelled request not at all).
    await anyio.sleep(delay_ms / 1000)
    return await charge(ctx, customer, amount_cents)


async def get_balance_tool(customer: Annotated[str, Field(min_length=1)], ctx: Context) -> CallToolResult:
    def read() -> dict[str, Any]:
        cents, n = db.execute(BALANCE, (customer,)).fetchone()
        return text_result(
            f"balance {customer} {cents} ({n} charges)",
            {"customer": customer, "balance_cents": cents, "charges": n},
        )

    meta = request_meta(ctx)
    if up.claim_of(meta) is None:
        return answer(read())  # not recorded: a plain read
    return answer(up.run_call(meta, lambda tx, call_id, now: (read(), [])))


async def set_nickname_tool(
    customer: Annotated[str, Field(min_length=1)],
    nickname: Annotated[str, Field(min_length=1)],
    ctx: Context,
) -> CallToolResult:
    def work(tx, call_id: str, now: int):
        tx.execute(SET_NICKNAME, (customer, nickname, now))
        return text_result(f"nickname of {customer} is {nickname}"), []

    return answer(up.run_call(request_meta(ctx), work))


TOOLS = [
    _ToolWithOutputSchema.of(
        charge_tool,
        name="charge",
        description="Charge a customer: writes a charge and queues a payment request to the payments API.",
        output=ChargeOutput,
    ),
    _ToolWithOutputSchema.of(
        slow_charge_tool,
        name="slow_charge",
        description="Like charge, but waits delay_ms first (reporting progress when asked); "
        "a cancelled call charges nothing.",
        output=ChargeOutput,
    ),
    _ToolWithOutputSchema.of(
        get_balance_tool,
        name="get_balance",
        description="The sum of a customer's charges, in cents.",
        output=BalanceOutput,
        annotations=ToolAnnotations(readOnlyHint=True),
    ),
    _ToolWithOutputSchema.of(
        set_nickname_tool,
        name="set_nickname",
        description="Set the nickname of a customer (the last one set wins).",
        annotations=ToolAnnotations(idempotentHint=True, destructiveHint=False),
    ),
]

# WARNING: FastMCP logs every request at INFO to stderr.
mcp = FastMCP("mcp-outbox-py-upstream", tools=TOOLS, log_level="WARNING")


class _FirstLineOfValidationWarnings(logging.Filter):
    """The SDK logs a request it cannot parse (a method it does not know,
    such as the server/discover a 2026-07-28 client probes with before it
    falls back to initialize) with one line per pydantic error, some thirty
    for every connection. The first line says what happened."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        if msg.startswith("Failed to validate request:") and "\n" in msg:
            record.msg, record.args = msg.split("\n", 1)[0], None
        return True


# The SDK logs it with logging.warning(), on the root logger.
logging.getLogger().addFilter(_FirstLineOfValidationWarnings())


@mcp.resource(
    "ledger://charges",
    name="ledger",
    title="Ledger",
    description="Every charge, one per line.",
    mime_type="text/plain",
)
async def ledger() -> str:
    # async: mcp 2.x runs a synchronous resource (or prompt, or tool)
    # function in a worker thread, where the sqlite3 connection, made on the
    # event loop's thread, refuses to be used; 1.x called it on the loop.
    rows = db.execute(LEDGER).fetchall()
    if not rows:
        return "no charges\n"
    return "".join(f"charge {i} {c} {a} {k}\n" for i, c, a, k in rows)


@mcp.prompt(name="summarize_charges", description="Ask for a summary of the charges, optionally of one customer.")
def summarize_charges(
    customer: Annotated[str | None, Field(description="Only this customer's charges")] = None,
) -> str:
    if customer:
        return f"Summarize the charges of {customer} in the resource ledger://charges."
    return "Summarize the charges in the resource ledger://charges."


# --- transports -------------------------------------------------------------


def ready(extra: str = "") -> None:
    sys.stderr.write(f"py-upstream ready pid={os.getpid()} cooperate={1 if cooperate else 0}{extra}\n")
    sys.stderr.flush()


def shutdown() -> None:
    """Exits at once, like server.mjs: a call still waiting (its slow work,
    shielded from cancellation) must not commit after the client went away.
    Called from the event loop, so never in the middle of a transaction."""
    try:
        db.close()
    finally:
        sys.stderr.flush()
        os._exit(0)


async def exit_on_signal() -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for _ in signals:
            shutdown()


async def serve_stdio() -> None:
    # FastMCP.run("stdio") would, on stdin's end, wait for the calls in
    # flight to finish (and commit); server.mjs exits at once. So the
    # messages go through a relay that notices the end of stdin.
    # FastMCP keeps its lowlevel server in _mcp_server (1.29, 1.30); MCPServer
    # in _lowlevel_server (2.x). Its run() takes the same arguments.
    server = mcp._lowlevel_server if MCP_MAJOR >= 2 else mcp._mcp_server
    async with stdio_server() as (stdin_messages, stdout_messages):
        relay_send, relay_receive = anyio.create_memory_object_stream(0)

        async def relay() -> None:
            async with relay_send:
                async for message in stdin_messages:
                    await relay_send.send(message)
            shutdown()  # stdin ended: the client is gone

        async with anyio.create_task_group() as tg:
            tg.start_soon(exit_on_signal)
            tg.start_soon(relay)
            ready()
            await server.run(relay_receive, stdout_messages, server.create_initialization_options())


async def serve_http(port: int) -> None:
    import uvicorn

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if self.started:
                ready(f" url=http://127.0.0.1:{sockets[0].getsockname()[1]}/mcp")

        def capture_signals(self):  # type: ignore[override]
            # uvicorn's handlers would shut down gracefully (waiting for
            # calls in flight); SIGTERM exits at once, as on stdio.
            return contextlib.nullcontext()

    # Bound here so that port 0 can be read back for the ready line.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)
    config = uvicorn.Config(mcp.streamable_http_app(), log_level="warning", access_log=False, lifespan="on")
    async with anyio.create_task_group() as tg:
        tg.start_soon(exit_on_signal)
        await Server(config).serve(sockets=[sock])
        tg.cancel_scope.cancel()


def main() -> None:
    if not http_port_env:
        anyio.run(serve_stdio)
        shutdown()
    if not re.fullmatch(r"[0-9]+", http_port_env) or int(http_port_env) > 65535:
        fail(f"UPSTREAM_HTTP_PORT={json.dumps(http_port_env)}: want a port number")
    anyio.run(serve_http, int(http_port_env))
    shutdown()


if __name__ == "__main__":
    main()
