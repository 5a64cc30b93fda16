// Matrix client: the official TypeScript MCP SDK client runs ONE seed
// scenario of ONE logical `charge` call and reports what the SDK did. The
// contract (plan in, one JSON report line out) is shared by every matrix
// client; the Go harness starts the servers, judges the report and counts
// the charges. This program asserts nothing about charges.
//
// Usage:
//   node matrix.mjs PLAN_FILE
//
// Scenarios (plan.scenario): "timeout" and "crash" (stdio: plan.server is
// spawned directly, no shell), "http-session" (Streamable HTTP at plan.url).
// plan.key: sent as params._meta.idempotencyKey of tools/call; "" or absent
// sends no key.
//
// SDK version: two versions of @modelcontextprotocol/sdk are installed side
// by side (package.json: the pinned newest under its own name, the one the
// seed write-up measured with under an npm alias). Choose with plan.sdk, or
// else the environment variable MCP_OUTBOX_TS_SDK:
//   "1.32.2" (the default)  @modelcontextprotocol/sdk
//   "1.30.0"                @modelcontextprotocol/sdk-1.30.0
// The report's versions are read from the installed package.json files.
//
// Exit status: 0 the run was carried out (whatever the tool answered), 2 a
// usage error or an unexpected exception. Either way the last stdout line is
// the JSON report; logs and the stdio server's stderr go to stderr.

import { readFileSync } from 'node:fs';
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';

// The SDK versions this directory installs, and the package directory each
// is installed under.
const SDK_PACKAGES = {
  '1.32.2': '@modelcontextprotocol/sdk',
  '1.30.0': '@modelcontextprotocol/sdk-1.30.0',
};
const DEFAULT_SDK = '1.32.2';

// Where the layer reports on a recorded call in a result's _meta.
const CALL_META = 'io.github.mcp-outbox/call';

// The SDK's error codes (the same in both versions): RequestTimeout is what a
// client-side timeout rejects with, ConnectionClosed what a request still
// pending rejects with when the transport closes.
const REQUEST_TIMEOUT = -32001;
const CONNECTION_CLOSED = -32000;

// Crash scenario: how often and how long to poll the database for killWhen.
const POLL_EVERY_MS = 20;
const POLL_FOR_MS = 20_000;

const report = { client: 'ts-sdk', versions: {}, attempts: [], error: '' };

function log(msg) {
  process.stderr.write(`matrix.mjs: ${msg}\n`);
}

function installedVersion(pkgDir) {
  const url = new URL(`./node_modules/${pkgDir}/package.json`, import.meta.url);
  return JSON.parse(readFileSync(url, 'utf8')).version;
}

class UsageError extends Error {}

function readPlan(path) {
  if (!path) {
    throw new UsageError('usage: node matrix.mjs PLAN_FILE');
  }
  const plan = JSON.parse(readFileSync(path, 'utf8'));
  const scenarios = ['timeout', 'crash', 'http-session'];
  if (!scenarios.includes(plan.scenario)) {
    throw new UsageError(`plan.scenario ${JSON.stringify(plan.scenario)}: this client runs ${scenarios.join(', ')}`);
  }
  if (plan.scenario === 'http-session' ? !plan.url : !plan.server?.command) {
    throw new UsageError(`plan for ${plan.scenario} needs ${plan.scenario === 'http-session' ? 'url' : 'server.command'}`);
  }
  if (plan.scenario === 'crash' && (!plan.db || !plan.killWhen)) {
    throw new UsageError('plan for crash needs db and killWhen');
  }
  plan.tool ??= 'charge';
  plan.arguments ??= {};
  plan.chargeIdField ??= 'charge_id';
  plan.timeoutMs ??= 300;
  plan.retryTimeoutMs ??= 30_000;
  return plan;
}

// loadSDK imports the chosen SDK version's client modules.
async function loadSDK(plan) {
  const version = plan.sdk || process.env.MCP_OUTBOX_TS_SDK || DEFAULT_SDK;
  const pkg = SDK_PACKAGES[version];
  if (!pkg) {
    throw new UsageError(`SDK version ${JSON.stringify(version)}: this directory installs ${Object.keys(SDK_PACKAGES).join(', ')}`);
  }
  const installed = installedVersion(pkg);
  if (installed !== version) {
    throw new UsageError(`${pkg} is ${installed}, want ${version}: run npm ci in testdata/ts-client`);
  }
  report.versions['@modelcontextprotocol/sdk'] = installed;
  report.versions.node = process.version;
  const [{ Client }, { StdioClientTransport }, { StreamableHTTPClientTransport }] = await Promise.all([
    import(`${pkg}/client/index.js`),
    import(`${pkg}/client/stdio.js`),
    import(`${pkg}/client/streamableHttp.js`),
  ]);
  return { Client, StdioClientTransport, StreamableHTTPClientTransport };
}

// connect connects a client over transport and records, on the transport,
// the JSON-RPC methods it sent (to see whether a timeout sent
// notifications/cancelled).
async function connect(sdk, transport) {
  transport.sentMethods = [];
  const send = transport.send.bind(transport);
  transport.send = (message, options) => {
    if (message.method) {
      transport.sentMethods.push(message.method);
    }
    return send(message, options);
  };
  // The client hands the negotiated version to setProtocolVersion when the
  // transport has one (the HTTP transport does); the stdio transport has
  // none, so give it one that only remembers the version.
  if (!transport.setProtocolVersion) {
    transport.setProtocolVersion = (v) => {
      transport.negotiatedVersion = v;
    };
  }
  const client = new sdk.Client({ name: 'mcp-outbox-matrix-ts', version: '0.0.0' });
  await client.connect(transport);
  report.protocolVersion ??= transport.negotiatedVersion ?? transport.protocolVersion;
  return client;
}

// listTools fills report.tools once; a failure is reported, not fatal: the
// scenario is about the charge.
async function listTools(client, timeout) {
  if (report.tools !== undefined || report.toolsError !== undefined) {
    return;
  }
  try {
    const res = await client.listTools(undefined, { timeout });
    report.tools = res.tools.map((t) => t.name);
  } catch (err) {
    report.toolsError = String(err?.message ?? err);
    log(`tools/list: ${report.toolsError}`);
  }
}

function stdioTransport(sdk, server) {
  return new sdk.StdioClientTransport({
    command: server.command,
    args: server.args ?? [],
    // The SDK passes the child only a few default variables plus `env`; the
    // contract adds plan.server.env to the whole inherited environment.
    env: { ...process.env, ...(server.env ?? {}) },
    cwd: server.cwd,
    stderr: 'inherit',
  });
}

function textOf(res) {
  return (res.content ?? []).filter((c) => c.type === 'text').map((c) => c.text).join('\n');
}

// chargeIdOf finds the charge id: structuredContent first, then the text as
// JSON, then "charge #N" / "charge N" in the text; 0 if none.
function chargeIdOf(res, field, text) {
  const fromStructured = res.structuredContent?.[field];
  if (Number.isInteger(fromStructured)) {
    return fromStructured;
  }
  try {
    const v = JSON.parse(text)?.[field];
    if (Number.isInteger(v)) {
      return v;
    }
  } catch {
    // not JSON
  }
  const m = /charge\s*#?\s*(\d+)/i.exec(text);
  return m ? Number(m[1]) : 0;
}

// errorKind classifies what a tools/call threw.
function errorKind(err) {
  if (err?.code === REQUEST_TIMEOUT) {
    return 'timeout';
  }
  if (err?.code === CONNECTION_CLOSED || /connection closed|ECONNRESET|socket hang up|fetch failed|terminated/i.test(String(err?.message))) {
    return 'closed';
  }
  return 'other';
}

// attempt makes one tools/call of the plan's tool and returns its report
// entry.
async function attempt(client, plan, what, timeout) {
  const params = { name: plan.tool, arguments: plan.arguments };
  if (plan.key) {
    params._meta = { idempotencyKey: plan.key };
  }
  const start = performance.now();
  const out = { what, errorKind: '', chargeId: 0, replayed: null };
  try {
    const res = await client.callTool(params, undefined, { timeout });
    const text = textOf(res);
    const meta = res._meta?.[CALL_META];
    if (typeof meta?.replayed === 'boolean') {
      out.replayed = meta.replayed;
    }
    if (res.isError === true) {
      out.toolError = text || JSON.stringify(res.content ?? null);
    } else {
      out.chargeId = chargeIdOf(res, plan.chargeIdField, text);
    }
    out.what += res.isError === true ? ': the tool answered isError' : `: answered charge ${out.chargeId}${out.replayed ? ' (replayed)' : ''}`;
  } catch (err) {
    out.errorKind = errorKind(err);
    out.error = String(err?.message ?? err);
    if (Number.isInteger(err?.code)) {
      out.errorCode = err.code;
    }
    out.what += `: threw ${out.errorKind} (${out.error})`;
  }
  out.ms = Math.round(performance.now() - start);
  report.attempts.push(out);
  log(`attempt ${report.attempts.length}: ${out.what} in ${out.ms} ms`);
  return out;
}

async function runTimeout(sdk, plan) {
  const transport = stdioTransport(sdk, plan.server);
  const client = await connect(sdk, transport);
  try {
    await listTools(client, plan.retryTimeoutMs);
    const first = await attempt(client, plan, `attempt 1 (timeout ${plan.timeoutMs} ms)`, plan.timeoutMs);
    first.cancelSent = transport.sentMethods.includes('notifications/cancelled');
    await attempt(client, plan, 'attempt 2, same connection', plan.retryTimeoutMs);
  } finally {
    // Closes the server's stdin and waits for it to exit (SIGTERM after 2 s).
    await client.close();
  }
}

// waitForKillWhen polls the run's database read-only until killWhen returns
// > 0 or until done() (attempt 1 ended), for at most POLL_FOR_MS. It says
// why it stopped.
async function waitForKillWhen(plan, done) {
  const { default: Database } = await import('better-sqlite3');
  const deadline = performance.now() + POLL_FOR_MS;
  let db;
  let lastError = '';
  try {
    while (performance.now() < deadline) {
      if (done()) {
        return `attempt 1 ended first${lastError ? ` (last poll error: ${lastError})` : ''}`;
      }
      try {
        db ??= new Database(plan.db, { readonly: true, fileMustExist: true, timeout: 5000 });
        const n = db.prepare(plan.killWhen).pluck().get();
        if (Number(n) > 0) {
          return `killWhen returned ${n}`;
        }
      } catch (err) {
        // The file or its tables may not be there yet: poll again.
        lastError = String(err?.message ?? err);
      }
      await sleep(POLL_EVERY_MS);
    }
    return `killWhen stayed 0 for ${POLL_FOR_MS} ms${lastError ? ` (last error: ${lastError})` : ''}`;
  } finally {
    db?.close();
  }
}

async function runCrash(sdk, plan) {
  const transport = stdioTransport(sdk, plan.server);
  let client = await connect(sdk, transport);
  try {
    await listTools(client, plan.retryTimeoutMs);
    let ended = false;
    const pending = attempt(client, plan, 'attempt 1 (server SIGKILLed during it)', plan.retryTimeoutMs)
      .finally(() => { ended = true; });
    const why = await waitForKillWhen(plan, () => ended);
    const pid = transport.pid;
    log(`${why}; SIGKILL server pid ${pid}`);
    report.killed = { pid, why };
    if (pid) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch (err) {
        report.killed.error = String(err?.message ?? err);
      }
    }
    const first = await pending;
    first.what += `; ${why}, SIGKILL pid ${pid}`;
  } finally {
    await client.close();
  }
  client = await connect(sdk, stdioTransport(sdk, plan.server));
  try {
    await attempt(client, plan, 'attempt 2, new connection to a restarted server', plan.retryTimeoutMs);
  } finally {
    await client.close();
  }
}

async function runHTTPSession(sdk, plan) {
  const transport = new sdk.StreamableHTTPClientTransport(new URL(plan.url));
  const client = await connect(sdk, transport);
  try {
    report.sessionId = transport.sessionId ?? null;
    await listTools(client, plan.retryTimeoutMs);
    const first = await attempt(client, plan, `attempt 1 (timeout ${plan.timeoutMs} ms)`, plan.timeoutMs);
    first.cancelSent = transport.sentMethods.includes('notifications/cancelled');
    await attempt(client, plan, 'attempt 2, same session', plan.retryTimeoutMs);
  } finally {
    try {
      await transport.terminateSession();
    } catch (err) {
      log(`terminate session: ${err?.message ?? err}`);
    }
    await client.close();
  }
}

let code = 0;
try {
  const plan = readPlan(process.argv[2]);
  report.scenario = plan.scenario;
  report.keyed = Boolean(plan.key);
  const sdk = await loadSDK(plan);
  const run = { timeout: runTimeout, crash: runCrash, 'http-session': runHTTPSession }[plan.scenario];
  await run(sdk, plan);
} catch (err) {
  log(err instanceof UsageError ? err.message : (err?.stack ?? String(err)));
  report.error = String(err?.message ?? err);
  code = 2;
}
process.stdout.write(`${JSON.stringify(report)}\n`, () => process.exit(code));
