// Tasks client, 2025-11-25 generation: the official TypeScript SDK's
// experimental Tasks client (client.experimental.tasks: callToolStream,
// getTask, getTaskResult, cancelTask) runs ONE case of ONE logical `charge`
// call and reports what the SDK did. The plan and the report are those of
// testdata/ext-tasks/tasks.mjs (see there for the cases); the Go harness
// (cmd/mcp-outbox/e2e/tasks_interop_test.go) judges. This program asserts
// nothing about charges.
//
// Usage:
//   node tasks.mjs PLAN_FILE
//
// The SDK speaks 2025-11-25 only (initialize; capability
// tasks.requests.tools.call, tool execution.taskSupport, params.task), so
// plan.protocol must be that or absent. The SDK version is chosen as in
// matrix.mjs (plan.sdk or MCP_OUTBOX_TS_SDK; 1.32.2 by default).
//
// Exit status: 0 the case was carried out (whatever the server answered), 2 a
// usage error or an unexpected exception, 3 the plan's deadline passed.
// Either way the last stdout line is the JSON report.

import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';

const SDK_PACKAGES = {
  '1.32.2': '@modelcontextprotocol/sdk',
  '1.30.0': '@modelcontextprotocol/sdk-1.30.0',
};
const DEFAULT_SDK = '1.32.2';
const PROTOCOL = '2025-11-25';
const CASES = ['complete', 'lost-handle', 'lost-handle-nokey', 'cancel', 'cancel-again', 'cancel-again-nokey', 'crash', 'other-principal'];
const TERMINAL = new Set(['completed', 'failed', 'cancelled']);
const POLL_EVERY_MS = 20;

const report = {
  client: 'ts-sdk-tasks',
  versions: {},
  protocolVersion: '',
  serverTasks: null,
  tools: [],
  case: '',
  calls: [],
  noTask: '',
  error: '',
};

function log(msg) {
  process.stderr.write(`tasks.mjs: ${msg}\n`);
}

class UsageError extends Error {}

function readPlan(path) {
  if (!path) {
    throw new UsageError('usage: node tasks.mjs PLAN_FILE');
  }
  const plan = JSON.parse(readFileSync(path, 'utf8'));
  if (!CASES.includes(plan.case)) {
    throw new UsageError(`plan.case ${JSON.stringify(plan.case)}: this client runs ${CASES.join(', ')}`);
  }
  plan.protocol ??= PROTOCOL;
  if (plan.protocol !== PROTOCOL) {
    throw new UsageError(`plan.protocol ${JSON.stringify(plan.protocol)}: the SDK's experimental Tasks are ${PROTOCOL} only`);
  }
  if (!plan.url && !plan.server?.command) {
    throw new UsageError('the plan needs url (Streamable HTTP) or server.command (stdio)');
  }
  if (plan.case === 'crash' && (!plan.createdFile || !plan.resumeFile)) {
    throw new UsageError('plan for crash needs createdFile and resumeFile');
  }
  if (plan.case === 'other-principal' && (!plan.url || !plan.token || !plan.otherToken)) {
    throw new UsageError('plan for other-principal needs url, token and otherToken');
  }
  plan.tool ??= 'charge';
  plan.arguments ??= {};
  plan.chargeIdField ??= 'charge_id';
  plan.requestTimeoutMs ??= 15_000;
  plan.deadlineMs ??= 60_000;
  return plan;
}

async function loadSDK(plan) {
  const version = plan.sdk || process.env.MCP_OUTBOX_TS_SDK || DEFAULT_SDK;
  const pkg = SDK_PACKAGES[version];
  if (!pkg) {
    throw new UsageError(`SDK version ${JSON.stringify(version)}: this directory installs ${Object.keys(SDK_PACKAGES).join(', ')}`);
  }
  const url = new URL(`./node_modules/${pkg}/package.json`, import.meta.url);
  const installed = JSON.parse(readFileSync(url, 'utf8')).version;
  if (installed !== version) {
    throw new UsageError(`${pkg} is ${installed}, want ${version}: run npm ci in testdata/ts-client`);
  }
  report.versions['@modelcontextprotocol/sdk'] = installed;
  report.versions.node = process.version;
  const [{ Client }, { StdioClientTransport }, { StreamableHTTPClientTransport }, { CallToolResultSchema }] = await Promise.all([
    import(`${pkg}/client/index.js`),
    import(`${pkg}/client/stdio.js`),
    import(`${pkg}/client/streamableHttp.js`),
    import(`${pkg}/types.js`),
  ]);
  return { Client, StdioClientTransport, StreamableHTTPClientTransport, CallToolResultSchema };
}

function wireLog(dir, who, msg) {
  let s = JSON.stringify(msg);
  if (s.length > 1500) {
    s = `${s.slice(0, 1500)}…(${s.length} bytes)`;
  }
  process.stderr.write(`wire ${dir} ${who} ${s}\n`);
}

let conns = 0;

// connect opens one connection and lists the tools: the SDK calls a tool as
// a task only when tools/list said it may (execution.taskSupport) and the
// server has the capability.
async function connect(sdk, plan, token) {
  const who = `conn${++conns}`;
  let transport;
  if (plan.url) {
    transport = new sdk.StreamableHTTPClientTransport(new URL(plan.url), token
      ? { requestInit: { headers: { Authorization: `Bearer ${token}` } } }
      : undefined);
  } else {
    transport = new sdk.StdioClientTransport({
      command: plan.server.command,
      args: plan.server.args ?? [],
      env: { ...process.env, ...(plan.server.env ?? {}) },
      cwd: plan.server.cwd,
      stderr: 'inherit',
    });
    // The stdio transport keeps no negotiated version; remember it.
    transport.setProtocolVersion = (v) => { transport.negotiatedVersion = v; };
  }
  const send = transport.send.bind(transport);
  transport.send = (msg, options) => {
    wireLog('>', who, msg);
    return send(msg, options);
  };
  // The SDK's Protocol calls a handler already set before its own.
  transport.onmessage = (msg) => wireLog('<', who, msg);
  const client = new sdk.Client({ name: 'mcp-outbox-ts-tasks', version: '0.0.0' });
  await client.connect(transport, { timeout: plan.requestTimeoutMs });
  report.protocolVersion ||= transport.negotiatedVersion ?? transport.protocolVersion ?? '';
  const caps = client.getServerCapabilities();
  report.serverTasks ??= caps?.tasks?.requests?.tools?.call !== undefined;
  const tools = await client.listTools(undefined, { timeout: plan.requestTimeoutMs });
  if (report.tools.length === 0) {
    report.tools = tools.tools.map((t) => t.name);
  }
  const tool = tools.tools.find((t) => t.name === plan.tool);
  log(`${who}: connected (${plan.url ? `HTTP ${plan.url}` : `stdio pid ${transport.pid}`}), server tasks ${JSON.stringify(caps?.tasks ?? null)}, ${plan.tool} execution ${JSON.stringify(tool?.execution ?? null)}`);
  return { who, client, transport, pid: transport.pid ?? null };
}

async function closeConn(conn) {
  try {
    await conn.client.close();
  } catch (err) {
    log(`${conn.who}: close: ${err?.message ?? err}`);
  }
}

function textOf(res) {
  return (res?.content ?? []).filter((c) => c.type === 'text').map((c) => c.text).join('\n');
}

function chargeIdOf(res, field) {
  const fromStructured = res?.structuredContent?.[field];
  if (Number.isInteger(fromStructured)) {
    return fromStructured;
  }
  const text = textOf(res);
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

function errorOf(err) {
  const out = { error: String(err?.message ?? err) };
  if (Number.isInteger(err?.code)) {
    out.errorCode = err.code;
  }
  return out;
}

function newCall(what) {
  const c = { what, kind: '', taskId: '', statuses: [], status: '', chargeId: 0, toolError: '', error: '', start: performance.now() };
  report.calls.push(c);
  return c;
}

function endCall(c) {
  c.ms = Math.round(performance.now() - c.start);
  delete c.start;
  log(`${c.what}: ${c.kind || '-'} ${c.taskId} statuses [${c.statuses.join(' ')}] final ${c.status || '-'} charge ${c.chargeId}${c.error ? ` error ${c.error}` : ''} in ${c.ms} ms`);
}

function seen(c, status) {
  if (c.statuses[c.statuses.length - 1] !== status) {
    c.statuses.push(status);
  }
}

function completed(c, plan, result) {
  c.status = 'completed';
  if (result?.isError === true) {
    c.toolError = textOf(result) || JSON.stringify(result);
  } else {
    c.chargeId = chargeIdOf(result, plan.chargeIdField);
  }
}

// stream makes the plan's call with callToolStream. With untilTask it stops
// reading (which stops the SDK's polling, and nothing else) once the task
// exists; otherwise it reads to the end.
async function stream(conn, plan, c, untilTask) {
  const params = { name: plan.tool, arguments: plan.arguments };
  if (plan.key) {
    params._meta = { idempotencyKey: plan.key };
  }
  try {
    for await (const msg of conn.client.experimental.tasks.callToolStream(params, undefined, { timeout: plan.requestTimeoutMs })) {
      switch (msg.type) {
        case 'taskCreated':
          c.kind = 'task';
          c.taskId = msg.task.taskId;
          seen(c, msg.task.status);
          if (untilTask) {
            return;
          }
          break;
        case 'taskStatus':
          seen(c, msg.task.status);
          if (TERMINAL.has(msg.task.status)) {
            c.status = msg.task.status;
          }
          break;
        case 'result':
          c.kind ||= 'immediate';
          completed(c, plan, msg.result);
          break;
        case 'error':
          c.kind ||= 'error';
          Object.assign(c, errorOf(msg.error));
          break;
      }
    }
  } catch (err) {
    c.kind ||= 'error';
    Object.assign(c, errorOf(err));
  }
}

function noTask(c) {
  if (c.kind === 'task') {
    return false;
  }
  const why = c.kind === 'immediate'
    ? `the server answered tools/call immediately, without a task (${report.protocolVersion})`
    : `tools/call failed: ${c.error}`;
  report.noTask = `${why}; the initialize result lists capabilities.tasks.requests.tools.call: ${report.serverTasks}`;
  endCall(c);
  return true;
}

// poll reads the task until it is terminal, then its result if completed.
async function poll(sdk, conn, plan, c, signal) {
  const tasks = conn.client.experimental.tasks;
  for (;;) {
    signal.throwIfAborted();
    const task = await tasks.getTask(c.taskId, { timeout: plan.requestTimeoutMs });
    seen(c, task.status);
    if (TERMINAL.has(task.status)) {
      c.status = task.status;
      if (task.status === 'completed') {
        // getTaskResult has no default schema (callToolStream has one):
        // without it the SDK fails reading the answer.
        completed(c, plan, await tasks.getTaskResult(c.taskId, sdk.CallToolResultSchema, { timeout: plan.requestTimeoutMs }));
      }
      return;
    }
    await sleep(Math.max(POLL_EVERY_MS, task.pollInterval ?? 0), undefined, { signal });
  }
}

async function runComplete(sdk, plan) {
  const conn = await connect(sdk, plan);
  try {
    const c = newCall('call (slow: becomes a task)');
    await stream(conn, plan, c, false);
    if (!noTask(c)) {
      endCall(c);
    }
  } finally {
    await closeConn(conn);
  }
}

// runLostHandle: see testdata/ext-tasks/tasks.mjs (the second connection
// is opened first; plan.keepFirstOpen). The SDK's close() cancels nothing:
// no task is dropped by closing.
async function runLostHandle(sdk, plan) {
  const first = await connect(sdk, plan);
  let closed = false;
  const closeFirst = async () => {
    if (!closed) {
      closed = true;
      await closeConn(first);
    }
  };
  let second;
  try {
    second = await connect(sdk, plan);
    const c1 = newCall('call 1 (its handle is then lost)');
    await stream(first, plan, c1, true);
    if (noTask(c1)) {
      return;
    }
    c1.status = 'dropped';
    endCall(c1);
    if (!plan.keepFirstOpen) {
      await closeFirst();
    }
    const c2 = newCall(`call 2, the same call${plan.key ? ' and key' : ' without a key'} from the second connection${plan.keepFirstOpen ? ' (the first still open)' : ''}`);
    await stream(second, plan, c2, false);
    endCall(c2);
  } finally {
    if (second) {
      await closeConn(second);
    }
    await closeFirst();
  }
}

// cancelAndFollow cancels c's task and polls it until it is terminal.
async function cancelAndFollow(sdk, conn, plan, c, signal) {
  try {
    const task = await conn.client.experimental.tasks.cancelTask(c.taskId, { timeout: plan.requestTimeoutMs });
    c.cancelSent = true;
    seen(c, task.status);
    await poll(sdk, conn, plan, c, signal);
  } catch (err) {
    Object.assign(c, errorOf(err));
  }
  endCall(c);
}

async function runCancel(sdk, plan, signal) {
  const conn = await connect(sdk, plan);
  try {
    const c = newCall('call, cancelled at once');
    await stream(conn, plan, c, true);
    if (noTask(c)) {
      return;
    }
    await cancelAndFollow(sdk, conn, plan, c, signal);
  } finally {
    await closeConn(conn);
  }
}

// runCancelAgain: see testdata/ext-tasks/tasks.mjs. The first task is
// cancelled and polled until terminal, the same call is made again on the
// same connection and followed to its end, then the first task is read
// once more (tasks/get).
async function runCancelAgain(sdk, plan, signal) {
  const conn = await connect(sdk, plan);
  try {
    const c = newCall('call 1, cancelled at once');
    await stream(conn, plan, c, true);
    if (noTask(c)) {
      return;
    }
    await cancelAndFollow(sdk, conn, plan, c, signal);
    const c2 = newCall(`call 2, the same call${plan.key ? ' and key' : ' without a key'} asked again after the cancel`);
    await stream(conn, plan, c2, false);
    endCall(c2);
    const c3 = newCall('tasks/get of call 1\'s task, after call 2');
    c3.kind = 'task';
    c3.taskId = c.taskId;
    try {
      await poll(sdk, conn, plan, c3, signal);
    } catch (err) {
      Object.assign(c3, errorOf(err));
    }
    endCall(c3);
  } finally {
    await closeConn(conn);
  }
}

async function runCrash(sdk, plan, signal) {
  const first = await connect(sdk, plan);
  const c = newCall('call (the server is SIGKILLed while its task runs)');
  try {
    await stream(first, plan, c, true);
    if (noTask(c)) {
      return;
    }
    writeFileSync(plan.createdFile, JSON.stringify({ taskId: c.taskId, pid: first.pid }));
    log(`task ${c.taskId} created; waiting for ${plan.resumeFile}`);
    while (!existsSync(plan.resumeFile)) {
      await sleep(POLL_EVERY_MS, undefined, { signal });
    }
  } finally {
    await closeConn(first);
  }
  const second = await connect(sdk, plan);
  try {
    c.what += '; polled from a new connection';
    try {
      await poll(sdk, second, plan, c, signal);
    } catch (err) {
      Object.assign(c, errorOf(err));
    }
    endCall(c);
  } finally {
    await closeConn(second);
  }
}

async function runOtherPrincipal(sdk, plan, signal) {
  const owner = await connect(sdk, plan, plan.token);
  const other = await connect(sdk, plan, plan.otherToken);
  try {
    const c = newCall('call by the owner');
    await stream(owner, plan, c, true);
    if (noTask(c)) {
      return;
    }
    const o = { status: '', error: '' };
    try {
      o.status = (await other.client.experimental.tasks.getTask(c.taskId, { timeout: plan.requestTimeoutMs })).status;
    } catch (err) {
      Object.assign(o, errorOf(err));
    }
    report.otherPrincipal = o;
    try {
      await poll(sdk, owner, plan, c, signal);
    } catch (err) {
      Object.assign(c, errorOf(err));
    }
    endCall(c);
  } finally {
    await closeConn(other);
    await closeConn(owner);
  }
}

const RUNS = {
  complete: runComplete,
  'lost-handle': runLostHandle,
  'lost-handle-nokey': runLostHandle,
  cancel: runCancel,
  'cancel-again': runCancelAgain,
  'cancel-again-nokey': runCancelAgain,
  crash: runCrash,
  'other-principal': runOtherPrincipal,
};

function finish(code) {
  for (const c of report.calls) {
    if (c.start !== undefined) {
      endCall(c);
    }
  }
  process.stdout.write(`${JSON.stringify(report)}\n`, () => process.exit(code));
}

let code = 0;
try {
  const plan = readPlan(process.argv[2]);
  report.case = plan.case;
  report.keyed = Boolean(plan.key);
  report.transport = plan.url ? 'http' : 'stdio';
  const deadline = AbortSignal.timeout(plan.deadlineMs);
  deadline.addEventListener('abort', () => {
    report.error = `deadline: the case took more than ${plan.deadlineMs} ms`;
    log(report.error);
    finish(3);
  }, { once: true });
  const sdk = await loadSDK(plan);
  await RUNS[plan.case](sdk, plan, deadline);
} catch (err) {
  log(err instanceof UsageError ? err.message : (err?.stack ?? String(err)));
  report.error = String(err?.message ?? err);
  code = 2;
}
finish(code);
