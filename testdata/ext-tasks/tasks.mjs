// Tasks client: the official MCP Tasks client (@modelcontextprotocol/ext-tasks
// 0.2.2 over @modelcontextprotocol/client 2.x, protocol 2026-07-28) runs ONE
// case of ONE logical `charge` call and reports what the library did. The
// contract is the interop matrix's (plan in, one JSON report line out); the
// Go harness (cmd/mcp-outbox/e2e/tasks_interop_test.go) starts, kills and
// restarts the servers, judges the report and counts the charges. This
// program asserts nothing about charges.
//
// Usage:
//   node tasks.mjs PLAN_FILE
//
// Cases (plan.case):
//   complete           a slow call becomes a task; poll it until terminal.
//   lost-handle        call, keep the task id, drop the handle (detach, close
//                      the connection; with plan.keepFirstOpen the connection
//                      stays open until the retry was answered), make the
//                      identical call again with the same
//                      _meta.idempotencyKey from a new connection, and
//                      settle what that returns.
//   lost-handle-nokey  the same without a key (the server's fingerprint).
//   cancel             create a task and cancel it at once; poll its status
//                      until terminal.
//   cancel-again       create a task and cancel it at once; poll it until
//                      terminal; then make the identical call again (same
//                      plan.key) on the same connection and settle it; last, read the first
//                      task once more (tasks/get), as a third entry of
//                      report.calls.
//   cancel-again-nokey the same without a key (the server's fingerprint).
//   crash              create a task, hand it off, write plan.createdFile
//                      ({taskId, pid}), wait for plan.resumeFile (the harness
//                      SIGKILLs the server and, over HTTP, restarts it), then
//                      resume the task from a new connection (over stdio: a
//                      new server process from plan.server) until terminal.
//                      With plan.resumeUrl (HTTP) the new connection goes
//                      there instead of plan.url: another replica of the same
//                      service behind no sticky load balancer. The task
//                      reference stays plan.url's (ext-tasks resumes only on
//                      the endpoint a reference names, and the endpoint is the
//                      service, not one replica of it).
//   other-principal    (HTTP) create a task with plan.token, read it with
//                      plan.otherToken (must be "Task not found"), then settle
//                      it with the first token.
// With plan.listen (2026-07-28, case complete) the client opens
// subscriptions/listen for the task once it has it (Client.listen with the
// extension's filter, {taskIds: [id]}), so that the server's
// notifications/tasks reach ext-tasks; report.listen says what the listen
// did.
// Over stdio plan.server is spawned directly (no shell); over Streamable HTTP
// the client connects to plan.url. plan.key, when set, is sent as
// params._meta.idempotencyKey of tools/call.
//
// Generation (plan.protocol): "2026-07-28" (the default) negotiates that
// revision with server/discover and speaks the io.modelcontextprotocol/tasks
// extension; "2025-11-25" connects with initialize and speaks that
// revision's experimental Tasks (capability tasks.requests.tools.call, tool
// execution.taskSupport, params.task), which ext-tasks also implements. The
// cases are the same: ext-tasks hides the generation behind one API.
//
// When the server answers the first tools/call without a task (it lists no
// Tasks extension, or chose not to make one), the case stops there and
// report.noTask says why: there is nothing further to run.
//
// Every JSON-RPC message on the wire goes to stderr ("wire >" sent, "wire <"
// received), so a test log shows what the library really sends and expects.
//
// Exit status: 0 the case was carried out (whatever the server answered), 2 a
// usage error or an unexpected exception, 3 the plan's deadline passed.
// Either way the last stdout line is the JSON report.

import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';

import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { StdioClientTransport } from '@modelcontextprotocol/client/stdio';
import { JsonRpcResponseError, createTaskSessionFromClient } from '@modelcontextprotocol/ext-tasks/client';

const PROTOCOLS = ['2026-07-28', '2025-11-25'];
const TASKS_EXTENSION = 'io.modelcontextprotocol/tasks';
const CLIENT_INFO = { name: 'mcp-outbox-ext-tasks', version: '0.0.0' };
// What the client declares at connect; ext-tasks adds the Tasks extension to
// it on every request it frames (tools/call, tasks/*).
const CLIENT_CAPABILITIES = {};
const CASES = ['complete', 'lost-handle', 'lost-handle-nokey', 'cancel', 'cancel-again', 'cancel-again-nokey', 'crash', 'other-principal'];
const TERMINAL = new Set(['completed', 'failed', 'cancelled']);
// How often to look for plan.resumeFile, and to poll a task by hand.
const POLL_EVERY_MS = 20;

const report = {
  client: 'ext-tasks',
  versions: {},
  protocolVersion: '',
  serverTasks: null,
  tools: [],
  case: '',
  calls: [],
  noTask: '',
  listen: '',
  error: '',
};

function log(msg) {
  process.stderr.write(`tasks.mjs: ${msg}\n`);
}

class UsageError extends Error {}

function installedVersion(pkg) {
  const url = new URL(`./node_modules/${pkg}/package.json`, import.meta.url);
  return JSON.parse(readFileSync(url, 'utf8')).version;
}

function readPlan(path) {
  if (!path) {
    throw new UsageError('usage: node tasks.mjs PLAN_FILE');
  }
  const plan = JSON.parse(readFileSync(path, 'utf8'));
  if (!CASES.includes(plan.case)) {
    throw new UsageError(`plan.case ${JSON.stringify(plan.case)}: this client runs ${CASES.join(', ')}`);
  }
  if (!plan.url && !plan.server?.command) {
    throw new UsageError('the plan needs url (Streamable HTTP) or server.command (stdio)');
  }
  if (plan.case === 'crash' && (!plan.createdFile || !plan.resumeFile)) {
    throw new UsageError('plan for crash needs createdFile and resumeFile');
  }
  if (plan.resumeUrl && (plan.case !== 'crash' || !plan.url)) {
    throw new UsageError('plan.resumeUrl is for the crash case over HTTP (plan.url)');
  }
  if (plan.case === 'other-principal' && (!plan.url || !plan.token || !plan.otherToken)) {
    throw new UsageError('plan for other-principal needs url, token and otherToken');
  }
  plan.protocol ??= PROTOCOLS[0];
  if (!PROTOCOLS.includes(plan.protocol)) {
    throw new UsageError(`plan.protocol ${JSON.stringify(plan.protocol)}: this client speaks ${PROTOCOLS.join(', ')}`);
  }
  plan.tool ??= 'charge';
  plan.arguments ??= {};
  plan.chargeIdField ??= 'charge_id';
  plan.requestTimeoutMs ??= 15_000;
  plan.deadlineMs ??= 60_000;
  return plan;
}

// wireLog shortens a message for the log; results can be long.
function wireLog(dir, who, msg) {
  let s = JSON.stringify(msg);
  if (s.length > 1500) {
    s = `${s.slice(0, 1500)}…(${s.length} bytes)`;
  }
  process.stderr.write(`wire ${dir} ${who} ${s}\n`);
}

// RawCoordinator is the "host request coordinator" ext-tasks needs for a
// 2026-07-28 Tasks server (its option rawDispatch). @modelcontextprotocol/client
// 2.x decodes every result by its resultType and knows only "complete" and
// "input_required": a tools/call answered with resultType "task" is rejected
// before ext-tasks could see it, and the Client has no public way to send a
// request and get its raw result. So tools/call and tasks/* go straight to the
// Client's transport, under ids of their own (strings, which the Client's
// numeric ids never collide with), and their responses are taken off the
// transport before the Client sees them. The transport still adds the
// 2026-07-28 HTTP headers from the body (MCP-Protocol-Version, Mcp-Method,
// Mcp-Name = params.name or params.taskId), and ext-tasks frames the _meta.
class RawCoordinator {
  constructor(transport, who, defaultTimeoutMs) {
    this.transport = transport;
    this.who = who;
    this.defaultTimeoutMs = defaultTimeoutMs;
    this.pending = new Map();
    this.next = 0;
    this.closed = null;
    // The Client chains handlers already set when it connects: these log
    // every message and see the connection close. After connect, attach()
    // puts the interception in front of the Client's handler.
    transport.onmessage = (msg) => { wireLog('<', who, msg); this.note(msg); };
    transport.onclose = () => this.fail(new Error(`${who}: connection closed`));
    const send = transport.send.bind(transport);
    transport.send = (msg, options) => {
      wireLog('>', who, msg);
      return send(msg, options);
    };
    this.dispatch = this.dispatch.bind(this);
  }

  // attach takes the responses to our requests off the transport before the
  // Client's handler (installed by connect) could reject them as unknown.
  attach() {
    const inner = this.transport.onmessage;
    this.transport.onmessage = (msg, extra) => {
      const p = msg && typeof msg.id === 'string' ? this.pending.get(msg.id) : undefined;
      if (p && ('result' in msg || 'error' in msg)) {
        wireLog('<', this.who, msg);
        this.note(msg);
        this.pending.delete(msg.id);
        p.resolve('error' in msg ? { kind: 'error', error: msg.error } : { kind: 'result', result: msg.result });
        return;
      }
      inner(msg, extra);
    };
  }

  // note remembers the last task a tools/call created, as the server sent
  // it: ext-tasks hands back the handle (the task id) but not the status the
  // task was created with, which shows whether a retry found it running or
  // done. 2026-07-28 has the task's fields at the top of the result,
  // 2025-11-25 under result.task.
  note(msg) {
    const r = msg?.result;
    const task = r?.resultType === 'task' ? r : r?.task;
    if (typeof task?.taskId === 'string' && typeof task.status === 'string') {
      this.created = { taskId: task.taskId, status: task.status };
    }
  }

  fail(err) {
    this.closed ??= err;
    for (const p of this.pending.values()) {
      p.reject(err);
    }
    this.pending.clear();
  }

  // dispatch sends one framed request and resolves with its raw response
  // ({kind: 'result'|'error'}); it rejects on timeout, abort or a closed
  // connection, which ext-tasks reports as a DispatchError.
  async dispatch(request, options = {}) {
    if (this.closed) {
      throw this.closed;
    }
    const id = `ext-tasks-${++this.next}`;
    const timeoutMs = options.context?.requestTimeoutMs ?? this.defaultTimeoutMs;
    const signal = options.signal;
    signal?.throwIfAborted();
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new Error(`${this.who}: ${request.method} timed out after ${timeoutMs} ms`));
      }, timeoutMs);
      const onAbort = () => {
        this.pending.delete(id);
        clearTimeout(timer);
        reject(signal.reason ?? new Error('aborted'));
      };
      signal?.addEventListener('abort', onAbort, { once: true });
      const done = (fn) => (v) => { clearTimeout(timer); signal?.removeEventListener('abort', onAbort); fn(v); };
      this.pending.set(id, { resolve: done(resolve), reject: done(reject) });
      const headers = options.context?.headers;
      this.transport.send({ jsonrpc: '2.0', id, ...request }, headers ? { headers } : undefined)
        .catch((err) => { this.pending.get(id)?.reject(err); this.pending.delete(id); });
    });
  }
}

// InPlaceStdio is the SDK's stdio transport under another name: with version
// negotiation, @modelcontextprotocol/client sends its server/discover probe
// from a second, short-lived server process when the transport is exactly
// StdioClientTransport, and on the connection itself for a subclass. One
// process per connection: the crash case must know which one it kills, and
// serve need not open the database twice.
class InPlaceStdio extends StdioClientTransport {}

// Conn is one connection: a Client, its transport, the raw coordinator and
// the ext-tasks session over them.
class Conn {
  static count = 0;

  // url, when given, is where this connection goes instead of plan.url.
  constructor(plan, { token, url } = {}) {
    this.who = `conn${++Conn.count}`;
    this.url = url ?? plan.url;
    if (this.url) {
      const who = this.who;
      this.transport = new StreamableHTTPClientTransport(new URL(this.url), {
        ...(token ? { requestInit: { headers: { Authorization: `Bearer ${token}` } } } : {}),
        // The 2026-07-28 headers are the transport's, derived from the body:
        // log them too, since the server routes and checks by them.
        fetch: (url, init) => {
          const h = new Headers(init?.headers);
          const shown = ['mcp-protocol-version', 'mcp-method', 'mcp-name', 'mcp-session-id']
            .filter((k) => h.has(k)).map((k) => `${k}: ${h.get(k)}`);
          process.stderr.write(`wire > ${who} HTTP ${init?.method ?? 'GET'} ${shown.join(', ')}${h.has('authorization') ? ', authorization: Bearer …' : ''}\n`);
          return fetch(url, init);
        },
      });
    } else {
      this.transport = new InPlaceStdio({
        command: plan.server.command,
        args: plan.server.args ?? [],
        env: { ...process.env, ...(plan.server.env ?? {}) },
        cwd: plan.server.cwd,
        stderr: 'inherit',
      });
    }
    this.raw = new RawCoordinator(this.transport, this.who, plan.requestTimeoutMs);
    this.modern = plan.protocol !== '2025-11-25';
    this.client = new Client(CLIENT_INFO, {
      capabilities: CLIENT_CAPABILITIES,
      // Pinned, not 'auto': 'auto' falls back to 2025-11-25 silently. Without
      // the option the client connects with initialize (2025-11-25).
      ...(this.modern ? { versionNegotiation: { mode: { pin: plan.protocol } } } : {}),
    });
  }

  async open(plan) {
    await this.client.connect(this.transport, { timeout: plan.requestTimeoutMs });
    this.raw.attach();
    this.pid = this.transport.pid ?? null;
    const version = this.client.getNegotiatedProtocolVersion();
    report.protocolVersion ||= version ?? '';
    const caps = this.client.getServerCapabilities();
    let tasks;
    if (this.modern) {
      const ext = caps?.extensions?.[TASKS_EXTENSION];
      // ext-tasks reads anything but exactly {} as "no Tasks" (sdk-client-adapter).
      tasks = ext !== null && typeof ext === 'object' && !Array.isArray(ext) && Object.keys(ext).length === 0;
    } else {
      tasks = caps?.tasks?.requests?.tools?.call !== undefined;
    }
    report.serverTasks ??= tasks;
    log(`${this.who}: connected (${this.url ? `HTTP ${this.url}` : `stdio pid ${this.pid}`}), protocol ${version}, era ${this.client.getProtocolEra()}, server extensions ${JSON.stringify(caps?.extensions ?? null)}, tasks ${JSON.stringify(caps?.tasks ?? null)}`);
    const options = {
      // plan.url even on a connection to plan.resumeUrl: resumeTask refuses a
      // reference whose endpointId is not this session's.
      endpointId: `mcp-outbox:${plan.url ?? plan.server.command}`,
      onError: (err) => log(`${this.who}: ext-tasks background error: ${err?.stack ?? err}`),
    };
    if (this.modern) {
      options.rawDispatch = this.raw.dispatch;
      options.v2RequestFraming = { protocolVersion: version ?? plan.protocol, clientInfo: CLIENT_INFO, clientCapabilities: CLIENT_CAPABILITIES };
    }
    this.session = createTaskSessionFromClient(this.client, options);
    log(`${this.who}: ext-tasks session, generation ${JSON.stringify(this.session.capabilities)}`);
    return this;
  }

  async listTools(plan) {
    if (report.tools.length > 0) {
      return;
    }
    const res = await this.client.listTools(undefined, { timeout: plan.requestTimeoutMs });
    report.tools = res.tools.map((t) => t.name);
  }

  // close ends the session (which cancels every task it still owns: detach
  // or hand off first to keep one running) and the connection.
  async close() {
    try {
      await this.session?.close();
    } catch (err) {
      log(`${this.who}: session close: ${err?.message ?? err}`);
    }
    try {
      await this.client.close();
    } catch (err) {
      log(`${this.who}: client close: ${err?.message ?? err}`);
    }
  }
}

function textOf(res) {
  return (res?.content ?? []).filter((c) => c.type === 'text').map((c) => c.text).join('\n');
}

// chargeIdOf finds the charge id: structuredContent first, then the text as
// JSON, then "charge #N" in the text; 0 if none.
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
  if (err?.cause) {
    out.error += ` (cause: ${err.cause?.message ?? err.cause})`;
  }
  return out;
}

// newCall starts a report entry.
function newCall(what) {
  const c = { what, kind: '', taskId: '', statuses: [], status: '', chargeId: 0, toolError: '', error: '', start: performance.now() };
  report.calls.push(c);
  return c;
}

function endCall(c) {
  c.ms = Math.round(performance.now() - c.start);
  delete c.start;
  log(`${c.what}: ${c.kind || '-'} ${c.taskId} statuses [${c.statuses.join(' ')}] final ${c.status || '-'} charge ${c.chargeId}${c.error ? ` error ${c.error}` : ''}${c.toolError ? ` toolError ${c.toolError}` : ''} in ${c.ms} ms`);
}

function seen(c, status) {
  if (c.statuses[c.statuses.length - 1] !== status) {
    c.statuses.push(status);
  }
}

// callTool makes the plan's tools/call through ext-tasks and fills c with
// what came back; it returns the execution.
async function callTool(conn, plan, c) {
  const options = { requestTimeoutMs: plan.requestTimeoutMs };
  if (!conn.modern) {
    // 2025-11-25: the client decides. ext-tasks sends params.task for a tool
    // whose execution.taskSupport is "required", or "optional" when the call
    // prefers a task; on 2026-07-28 the server decides and this is ignored.
    options.task = { preference: 'prefer' };
  }
  if (plan.key) {
    options.metadata = { idempotencyKey: plan.key };
  }
  try {
    const ex = await conn.session.callTool(plan.tool, plan.arguments, options);
    c.kind = ex.kind;
    if (ex.kind === 'task') {
      c.taskId = ex.handle.taskId;
      if (conn.raw.created?.taskId === c.taskId) {
        seen(c, conn.raw.created.status);
      }
    }
    return ex;
  } catch (err) {
    c.kind = 'error';
    Object.assign(c, errorOf(err));
    return null;
  }
}

// settle waits for the execution's outcome and records every status seen.
async function settle(ex, plan, c, signal) {
  try {
    const { outcome } = await ex.settle({
      signal,
      onEvent: (ev) => {
        if (ev.type === 'task') {
          seen(c, ev.task.status);
        }
      },
    });
    c.status = outcome.status;
    if (ex.kind === 'task') {
      seen(c, outcome.status);
    }
    if (outcome.status === 'completed') {
      if (outcome.result?.isError === true) {
        c.toolError = textOf(outcome.result) || JSON.stringify(outcome.result);
      } else {
        c.chargeId = chargeIdOf(outcome.result, plan.chargeIdField);
      }
    } else if (outcome.status === 'failed') {
      Object.assign(c, errorOf(outcome.error));
    }
  } catch (err) {
    Object.assign(c, errorOf(err));
  }
}

// noTask ends the case when the first call was not made a task.
function noTask(c) {
  if (c.kind === 'task') {
    return false;
  }
  const why = c.kind === 'immediate'
    ? `the server answered tools/call immediately, without a task (${report.protocolVersion})`
    : `tools/call failed: ${c.error}`;
  const listed = report.protocolVersion === '2025-11-25'
    ? `the initialize result lists capabilities.tasks.requests.tools.call: ${report.serverTasks}`
    : `server/discover lists ${TASKS_EXTENSION}: ${report.serverTasks}`;
  report.noTask = `${why}; ${listed}`;
  return true;
}

async function firstCall(conn, plan, what, signal) {
  const c = newCall(what);
  const ex = await callTool(conn, plan, c);
  if (noTask(c)) {
    if (ex) {
      await settle(ex, plan, c, signal);
    }
    endCall(c);
    return { c, ex: null };
  }
  return { c, ex };
}

async function runComplete(plan, signal) {
  const conn = await new Conn(plan).open(plan);
  try {
    await conn.listTools(plan);
    const { c, ex } = await firstCall(conn, plan, 'call (slow: becomes a task)', signal);
    let sub = null;
    if (ex && plan.listen && conn.modern) {
      try {
        sub = await conn.client.listen({ taskIds: [c.taskId] }, { timeout: plan.requestTimeoutMs });
        report.listen = 'acknowledged';
        sub.closed.then((how) => log(`listen closed: ${how}`));
      } catch (err) {
        report.listen = `failed: ${errorOf(err).error}`;
      }
    }
    if (ex) {
      await settle(ex, plan, c, signal);
      endCall(c);
    }
    await sub?.close();
  } finally {
    await conn.close();
  }
}

// runLostHandle drops the first task's handle the way a client that lost
// the answer would: nothing of it is used again. It is released without a
// cancel (ext-tasks cancels every task a closing session still owns). The
// retry goes over a second connection, opened before the first call so that
// the retry comes while the task runs (a stdio connection starts a server
// process, which takes a while on a busy machine). The first connection is
// closed before the retry, or, with plan.keepFirstOpen, only after it: over
// stdio closing it ends its server, which finishes the task before it exits,
// so the retry finds the task done; kept open, the retry reaches the second
// server process while the first still runs the task.
async function runLostHandle(plan, signal) {
  const first = await new Conn(plan).open(plan);
  let closed = false;
  const closeFirst = async () => {
    if (!closed) {
      closed = true;
      await first.close();
    }
  };
  let second;
  try {
    second = await new Conn(plan).open(plan);
    await first.listTools(plan);
    const r = await firstCall(first, plan, 'call 1 (its handle is then lost)', signal);
    if (!r.ex) {
      return;
    }
    await release(r.ex, () => r.ex.detach());
    r.c.status = 'dropped';
    endCall(r.c);
    if (!plan.keepFirstOpen) {
      await closeFirst();
    }
    const c2 = newCall(`call 2, the same call${plan.key ? ' and key' : ' without a key'} from the second connection${plan.keepFirstOpen ? ' (the first still open)' : ''}`);
    const ex = await callTool(second, plan, c2);
    await closeFirst();
    if (ex) {
      await settle(ex, plan, c2, signal);
    }
    endCall(c2);
  } finally {
    await second?.close();
    await closeFirst();
  }
}

// release lets go of a task without cancelling it (detach or handoff), then
// waits until the execution has settled locally. ext-tasks 0.2.2 forgets a
// detached execution only once its driver has unwound: a session closed
// before that still counts it as unsettled and sends tasks/cancel for it,
// although it was detached or handed off (session.close -> execution.close).
async function release(ex, how) {
  await how();
  await ex.result().catch(() => {});
}

// pollTask reads a task through a manual controller until it is terminal.
async function pollTask(conn, taskId, plan, c, signal) {
  const task = conn.session.task(taskId, { requestTimeoutMs: plan.requestTimeoutMs });
  for (;;) {
    signal.throwIfAborted();
    const view = await task.snapshot(signal);
    seen(c, view.status);
    if (TERMINAL.has(view.status)) {
      c.status = view.status;
      return view;
    }
    await sleep(Math.max(POLL_EVERY_MS, view.suggestedPollIntervalMs ?? 0), undefined, { signal });
  }
}

// cancelAndFollow cancels c's task (ex) and polls it until it is terminal.
async function cancelAndFollow(conn, plan, c, ex, signal) {
  try {
    await ex.cancel(signal);
    c.cancelSent = true;
  } catch (err) {
    Object.assign(c, errorOf(err));
    c.error = `cancel: ${c.error}`;
  }
  try {
    await pollTask(conn, c.taskId, plan, c, signal);
  } catch (err) {
    if (!c.error) {
      Object.assign(c, errorOf(err));
    }
  }
  endCall(c);
}

async function runCancel(plan, signal) {
  const conn = await new Conn(plan).open(plan);
  try {
    await conn.listTools(plan);
    const { c, ex } = await firstCall(conn, plan, 'call, cancelled at once', signal);
    if (!ex) {
      return;
    }
    await cancelAndFollow(conn, plan, c, ex, signal);
  } finally {
    await conn.close();
  }
}

// runCancelAgain is a user who stops a call and then asks for it again:
// the second call must run, and the first task stay cancelled.
async function runCancelAgain(plan, signal) {
  const conn = await new Conn(plan).open(plan);
  try {
    await conn.listTools(plan);
    const { c, ex } = await firstCall(conn, plan, 'call 1, cancelled at once', signal);
    if (!ex) {
      return;
    }
    await cancelAndFollow(conn, plan, c, ex, signal);
    const c2 = newCall(`call 2, the same call${plan.key ? ' and key' : ' without a key'} asked again after the cancel`);
    const ex2 = await callTool(conn, plan, c2);
    if (ex2) {
      await settle(ex2, plan, c2, signal);
    }
    endCall(c2);
    const c3 = newCall('tasks/get of call 1\'s task, after call 2');
    c3.kind = 'task';
    c3.taskId = c.taskId;
    try {
      await pollTask(conn, c.taskId, plan, c3, signal);
    } catch (err) {
      Object.assign(c3, errorOf(err));
    }
    endCall(c3);
  } finally {
    await conn.close();
  }
}

async function waitForFile(path, signal) {
  while (!existsSync(path)) {
    await sleep(POLL_EVERY_MS, undefined, { signal });
  }
}

async function runCrash(plan, signal) {
  const first = await new Conn(plan).open(plan);
  let reference;
  let c;
  try {
    await first.listTools(plan);
    const r = await firstCall(first, plan, 'call (the server is SIGKILLed while its task runs)', signal);
    c = r.c;
    if (!r.ex) {
      return;
    }
    // The official way to keep a task past its connection: persist its
    // reference, which releases it without cancelling it.
    await release(r.ex, () => r.ex.handoff((ref) => { reference = ref; }));
    writeFileSync(plan.createdFile, JSON.stringify({ taskId: c.taskId, pid: first.pid }));
    log(`task ${c.taskId} created and handed off; waiting for ${plan.resumeFile}`);
    await waitForFile(plan.resumeFile, signal);
    c.resumedAfterMs = Math.round(performance.now() - c.start);
  } finally {
    await first.close();
  }
  const second = await new Conn(plan, { url: plan.resumeUrl }).open(plan);
  try {
    c.what += `; resumed from a new connection${plan.resumeUrl ? ` to ${plan.resumeUrl}` : ''}`;
    try {
      const ex = await second.session.resumeTask(reference, { requestTimeoutMs: plan.requestTimeoutMs });
      await settle(ex, plan, c, signal);
    } catch (err) {
      // resumeTask reads the task first (tasks/get): a server that lost it
      // answers "Task not found" here.
      Object.assign(c, errorOf(err));
      c.error = `resume: ${c.error}`;
    }
    endCall(c);
  } finally {
    await second.close();
  }
}

async function runOtherPrincipal(plan, signal) {
  const owner = await new Conn(plan, { token: plan.token }).open(plan);
  const other = await new Conn(plan, { token: plan.otherToken }).open(plan);
  try {
    await owner.listTools(plan);
    const { c, ex } = await firstCall(owner, plan, 'call by the owner', signal);
    if (!ex) {
      return;
    }
    const o = { status: '', error: '' };
    try {
      const view = await other.session.task(c.taskId, { requestTimeoutMs: plan.requestTimeoutMs }).snapshot(signal);
      o.status = view.status;
    } catch (err) {
      Object.assign(o, errorOf(err));
      o.rpcError = err instanceof JsonRpcResponseError;
    }
    report.otherPrincipal = o;
    log(`tasks/get by another principal: ${o.status ? `status ${o.status}` : `error ${o.errorCode} ${o.error}`}`);
    await settle(ex, plan, c, signal);
    endCall(c);
  } finally {
    await other.close();
    await owner.close();
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
  for (const pkg of ['@modelcontextprotocol/ext-tasks', '@modelcontextprotocol/client']) {
    report.versions[pkg] = installedVersion(pkg);
  }
  report.versions.node = process.version;
  // The plan's deadline bounds the whole case: past it the report says so
  // and the program exits, whatever is still pending.
  const deadline = AbortSignal.timeout(plan.deadlineMs);
  deadline.addEventListener('abort', () => {
    report.error = `deadline: the case took more than ${plan.deadlineMs} ms`;
    log(report.error);
    finish(3);
  }, { once: true });
  await RUNS[plan.case](plan, deadline);
} catch (err) {
  log(err instanceof UsageError ? err.message : (err?.stack ?? String(err)));
  report.error = String(err?.message ?? err);
  code = 2;
}
finish(code);
