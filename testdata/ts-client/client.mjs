// Interop check: the official TypeScript MCP SDK client against a real
// `mcp-outbox serve`, over stdio and Streamable HTTP.
//
// Usage:
//   node client.mjs stdio BINARY DB   charge twice with one key (the second is
//                                     a replay); a charge that times out on the
//                                     client, retried with the same key; then
//                                     call_status for both keys
//   node client.mjs http URL          charge twice with one key against a
//                                     running `serve --http` (URL ends in /mcp)
//
// Prints exactly one JSON line on stdout: what each call returned and a list
// of checks. Exit status: 0 all checks passed, 1 a check failed, 2 usage
// error or an unexpected exception (the JSON line is still printed). The
// server's stderr passes through to ours. cmd/mcp-outbox/e2e/interop_test.go
// runs this and checks the database as well.

import { randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { performance } from 'node:perf_hooks';

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { ErrorCode, McpError } from '@modelcontextprotocol/sdk/types.js';

// Where the layer reports on a recorded call in a result's _meta.
const CALL_META = 'io.github.mcp-outbox/call';

// Where a replayed result's structuredContent carries the layer's note.
const NOTE = 'mcp_outbox';

// The timed-out attempt: the server takes DEMO_DELAY inside charge, the
// client gives up after CLIENT_TIMEOUT_MS, then retries with RETRY_TIMEOUT_MS.
const DEMO_DELAY = '1s';
const CLIENT_TIMEOUT_MS = 300;
const RETRY_TIMEOUT_MS = 30_000;

// Distinct amounts, so that the charges table can be counted per logical call.
const AMOUNTS = { replay: 1111, timeout: 2222, http: 3333 };

const sdkVersion = JSON.parse(
  readFileSync(new URL('./node_modules/@modelcontextprotocol/sdk/package.json', import.meta.url), 'utf8'),
).version;

const summary = { mode: process.argv[2] ?? '', sdkVersion, node: process.version, checks: [] };

function check(name, ok, detail) {
  summary.checks.push({ name, ok: Boolean(ok), ...(detail === undefined ? {} : { detail }) });
}

function newKey(what) {
  return `ts-interop-${what.replaceAll(' ', '-')}-${randomUUID()}`;
}

// connect returns a connected client and the list of JSON-RPC methods it
// has sent (responses are recorded as "response").
async function connect(transport) {
  const sent = [];
  const send = transport.send.bind(transport);
  transport.send = (message, options) => {
    sent.push(message.method ?? 'response');
    return send(message, options);
  };
  const client = new Client({ name: 'mcp-outbox-ts-interop', version: '0.0.0' });
  await client.connect(transport);
  summary.server ??= client.getServerVersion();
  return { client, sent };
}

// call makes one tools/call and describes its outcome: a result (isError or
// not) or the error it threw.
async function call(client, name, args, key, timeout) {
  const params = { name, arguments: args };
  if (key !== undefined) {
    params._meta = { idempotencyKey: key };
  }
  const start = performance.now();
  const out = { key };
  try {
    const res = await client.callTool(params, undefined, { timeout });
    const meta = res._meta?.[CALL_META];
    Object.assign(out, {
      isError: res.isError === true,
      replayed: typeof meta?.replayed === 'boolean' ? meta.replayed : null,
      structured: res.structuredContent ?? null,
      text: (res.content ?? []).filter((c) => c.type === 'text').map((c) => c.text).join('\n'),
    });
    if (name === 'charge' && !out.isError) {
      out.chargeId = res.structuredContent?.charge_id ?? null;
    }
  } catch (err) {
    out.error = {
      code: err instanceof McpError ? err.code : null,
      message: String(err?.message ?? err),
    };
  }
  out.ms = Math.round(performance.now() - start);
  return out;
}

function succeeded(c) {
  return c.error === undefined && !c.isError;
}

// replayPair charges twice with one key and checks the second is a replay
// of the first.
//
// The tools are listed first: the SDK then validates each result's
// structuredContent against the tool's outputSchema (with AJV), which for
// charge forbids properties it does not list. The replay's note
// (structuredContent.mcp_outbox, all Claude Code shows the model) must pass.
async function replayPair(client, what, amount) {
  const key = newKey(what);
  const { tools } = await client.listTools();
  const charge = tools.find((t) => t.name === 'charge');
  check(`${what}: charge's outputSchema lists ${NOTE}`,
    charge?.outputSchema?.properties?.[NOTE]?.type === 'string' && charge?.outputSchema?.additionalProperties === false,
    charge?.outputSchema);
  const first = await call(client, 'charge', { amount }, key, RETRY_TIMEOUT_MS);
  const second = await call(client, 'charge', { amount }, key, RETRY_TIMEOUT_MS);
  check(`${what}: first charge has no note`, first.structured?.[NOTE] === undefined, first.structured);
  check(`${what}: replay's structuredContent has the note`,
    String(second.structured?.[NOTE] ?? '').startsWith('[mcp-outbox] Replayed: '), second.structured);
  check(`${what}: first charge succeeded`, succeeded(first), first.error ?? first.text);
  check(`${what}: first charge not replayed`, first.replayed === false, first.replayed);
  check(`${what}: second charge succeeded`, succeeded(second), second.error ?? second.text);
  check(`${what}: second charge replayed`, second.replayed === true, second.replayed);
  check(`${what}: same charge id`, first.chargeId != null && first.chargeId === second.chargeId,
    [first.chargeId, second.chargeId]);
  return { key, amount, first, second };
}

function stdioTransport(binary, db, ...extra) {
  return new StdioClientTransport({
    command: binary,
    args: ['serve', '--db', db, '--log-level', 'warn', ...extra],
    stderr: 'inherit',
  });
}

async function runStdio(binary, db) {
  // (a) Two calls with one key on a plain server.
  {
    const { client } = await connect(stdioTransport(binary, db));
    try {
      summary.replay = await replayPair(client, 'stdio replay', AMOUNTS.replay);
    } finally {
      await client.close();
    }
  }

  // (b) A charge slower than the client's timeout, then a retry with the
  // same key on the same connection; (c) call_status for both keys. The
  // server is restarted (same database), so the status of (a) is read back
  // from the file.
  const { client, sent } = await connect(stdioTransport(binary, db, '--demo-delay', DEMO_DELAY));
  try {
    const key = newKey('stdio-timeout');
    const amount = AMOUNTS.timeout;
    const first = await call(client, 'charge', { amount }, key, CLIENT_TIMEOUT_MS);
    const cancelledSent = sent.includes('notifications/cancelled');
    const retry = await call(client, 'charge', { amount }, key, RETRY_TIMEOUT_MS);
    summary.timeout = { key, amount, clientTimeoutMs: CLIENT_TIMEOUT_MS, serverDelay: DEMO_DELAY, first, cancelledSent, retry };
    check('stdio timeout: first attempt failed with RequestTimeout (-32001)',
      first.error?.code === ErrorCode.RequestTimeout, first.error ?? 'no error');
    check('stdio timeout: client sent notifications/cancelled', cancelledSent, sent);
    check('stdio timeout: retry with the same key succeeded', succeeded(retry) && retry.chargeId != null,
      retry.error ?? retry.text);

    summary.status = {};
    for (const k of [summary.replay.key, key]) {
      const st = await call(client, 'call_status', { key: k }, undefined, RETRY_TIMEOUT_MS);
      summary.status[k] = {
        ...(st.error ? { error: st.error } : {}),
        isError: st.isError,
        state: st.structured?.state ?? null,
        tool: st.structured?.tool ?? null,
        attempts: st.structured?.attempts ?? null,
        effects: (st.structured?.effects ?? []).length,
      };
      check(`stdio status: ${k === key ? 'timed-out call' : 'replayed call'} is completed`,
        summary.status[k].state === 'completed', summary.status[k]);
    }
  } finally {
    await client.close();
  }
}

async function runHTTP(url) {
  const transport = new StreamableHTTPClientTransport(new URL(url));
  const { client } = await connect(transport);
  try {
    summary.sessionId = transport.sessionId ?? null;
    summary.replay = await replayPair(client, 'http replay', AMOUNTS.http);
  } finally {
    try {
      await transport.terminateSession();
    } catch (err) {
      process.stderr.write(`client.mjs: terminate session: ${err?.message ?? err}\n`);
    }
    await client.close();
  }
}

function finish(code) {
  summary.ok = code === 0 && summary.checks.length > 0 && summary.checks.every((c) => c.ok);
  if (code === 0 && !summary.ok) {
    code = 1;
  }
  process.stdout.write(`${JSON.stringify(summary)}\n`, () => process.exit(code));
}

const usage = 'usage: node client.mjs stdio BINARY DB | node client.mjs http URL';
const start = performance.now();
let code = 0;
try {
  const [mode, ...args] = process.argv.slice(2);
  if (mode === 'stdio' && args.length === 2) {
    await runStdio(args[0], args[1]);
  } else if (mode === 'http' && args.length === 1) {
    await runHTTP(args[0]);
  } else {
    process.stderr.write(`${usage}\n`);
    summary.error = usage;
    code = 2;
  }
} catch (err) {
  process.stderr.write(`client.mjs: ${err?.stack ?? err}\n`);
  summary.error = String(err?.message ?? err);
  code = 2;
}
summary.ms = Math.round(performance.now() - start);
finish(code);
