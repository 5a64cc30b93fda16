// Matrix client: LangGraph JS runs the seed's scenario 4 ("framework-retry")
// and reports what the framework did. A StateGraph has one node with the
// DEFAULT retry policy (`retryPolicy: {}`); the node calls the `charge` tool
// loaded through @langchain/mcp-adapters, then fails with a connection error
// on every node attempt but the last, so LangGraph re-runs the node and the
// tool call with it. The Go harness judges the report and counts charges;
// this program asserts nothing about them.
//
// Usage:
//   node graph.mjs PLAN_FILE
//
// plan.scenario must be "framework-retry". The server is plan.server (stdio,
// spawned directly) or, when plan.url is set, a running Streamable HTTP
// endpoint.
//
// Keys: @langchain/mcp-adapters 1.1 sends tools/call as {name, arguments}
// only. Its one per-call hook, beforeToolCall, can change the arguments and,
// over HTTP only, the request headers (the adapter then forks the client
// with those headers); nothing can put _meta on the request. So:
//   - stdio: no key can be sent; a plan with a key is a usage error (exit 2).
//   - HTTP (plan.url): the key goes in the Idempotency-Key header, set by
//     beforeToolCall; the report says so in keySentVia.
//
// Exit status: 0 the run was carried out (whatever the tool and the graph
// did), 2 a usage error or an unexpected exception. Either way the last
// stdout line is the JSON report; logs and the server's stderr go to stderr.

import { readFileSync } from 'node:fs';
import { performance } from 'node:perf_hooks';

import { Annotation, END, START, StateGraph } from '@langchain/langgraph';
import { MultiServerMCPClient } from '@langchain/mcp-adapters';

// LangGraph announces each retry with console.log, which writes to stdout;
// stdout is reserved for the report line, so its logs go to stderr.
console.log = (...args) => console.error(...args);

const CALL_META = 'io.github.mcp-outbox/call';
const SERVER = 'outbox';

const report = { client: 'langgraph-js', versions: {}, attempts: [], error: '' };

function log(msg) {
  process.stderr.write(`graph.mjs: ${msg}\n`);
}

class UsageError extends Error {}

function installedVersion(pkg) {
  const url = new URL(`./node_modules/${pkg}/package.json`, import.meta.url);
  return JSON.parse(readFileSync(url, 'utf8')).version;
}

function readPlan(path) {
  if (!path) {
    throw new UsageError('usage: node graph.mjs PLAN_FILE');
  }
  const plan = JSON.parse(readFileSync(path, 'utf8'));
  if (plan.scenario !== 'framework-retry') {
    throw new UsageError(`plan.scenario ${JSON.stringify(plan.scenario)}: this client runs framework-retry only`);
  }
  if (!plan.url && !plan.server?.command) {
    throw new UsageError('plan for framework-retry needs server.command (stdio) or url (Streamable HTTP)');
  }
  if (plan.key && !plan.url) {
    throw new UsageError('@langchain/mcp-adapters cannot send an idempotency key over stdio (no hook adds _meta to tools/call): run this client without a key, or over HTTP');
  }
  plan.tool ??= 'charge';
  plan.arguments ??= {};
  plan.chargeIdField ??= 'charge_id';
  plan.retryTimeoutMs ??= 30_000;
  plan.nodeAttempts ??= 3;
  return plan;
}

function connectionOf(plan) {
  if (plan.url) {
    return { transport: 'http', url: plan.url };
  }
  return {
    transport: 'stdio',
    command: plan.server.command,
    args: plan.server.args ?? [],
    // The MCP SDK hands the child only a few default variables plus `env`;
    // the contract adds plan.server.env to the whole inherited environment.
    env: { ...process.env, ...(plan.server.env ?? {}) },
    ...(plan.server.cwd ? { cwd: plan.server.cwd } : {}),
    stderr: 'inherit',
  };
}

// chargeIdOf finds the charge id in what the adapter returned: the
// structured content it keeps as an artifact, else the text (JSON, or
// "charge #N" / "charge N"); 0 if none.
function chargeIdOf(structured, text, field) {
  if (Number.isInteger(structured?.[field])) {
    return structured[field];
  }
  try {
    const v = JSON.parse(text)?.[field];
    if (Number.isInteger(v)) {
      return v;
    }
  } catch {
    // not JSON
  }
  const m = /charge\s*#?\s*(\d+)/i.exec(text ?? '');
  return m ? Number(m[1]) : 0;
}

function textOf(content) {
  if (typeof content === 'string') {
    return content;
  }
  const blocks = Array.isArray(content) ? content : [content];
  return blocks.filter((b) => b?.type === 'text').map((b) => b.text).join('\n');
}

// errorKind classifies what the tool call threw. The adapter wraps every
// failure in a ToolException whose message carries the SDK's error.
function errorKind(err) {
  const msg = String(err?.message ?? err);
  if (/-32001|timed out/i.test(msg)) {
    return 'timeout';
  }
  if (/-32000|connection closed|ECONNRESET|ECONNREFUSED|fetch failed|socket hang up/i.test(msg)) {
    return 'closed';
  }
  return 'other';
}

// The error the node raises after its tool call. LangGraph's default
// retryOn (pregel/retry.js, DEFAULT_RETRY_ON_HANDLER) retries any error
// except aborts/cancellations (message "Cancel..."/"AbortError...", name
// AbortError), GraphValueError, code ECONNABORTED, HTTP status 400-407/409
// and insufficient_quota. A plain Error with code ECONNRESET, as Node's
// network stack raises for a dropped connection, is retried.
function connectionError(nodeAttempt) {
  const err = new Error(`read ECONNRESET (simulated after the tool call, node attempt ${nodeAttempt})`);
  err.code = 'ECONNRESET';
  return err;
}

async function run(plan) {
  const client = new MultiServerMCPClient({
    mcpServers: { [SERVER]: connectionOf(plan) },
    defaultToolTimeout: plan.retryTimeoutMs,
    ...(plan.key ? {
      // Over HTTP the adapter forks the client with these headers for the
      // call; the layer reads the Idempotency-Key header as the key.
      beforeToolCall: () => ({ headers: { 'Idempotency-Key': plan.key } }),
    } : {}),
  });
  if (plan.key) {
    report.keySentVia = 'Idempotency-Key header (beforeToolCall)';
  }
  try {
    const tools = await client.getTools();
    report.tools = tools.map((t) => t.name);
    const mcpClient = await client.getClient(SERVER);
    report.protocolVersion = mcpClient?.transport?.protocolVersion;
    const tool = tools.find((t) => t.name === plan.tool);
    if (!tool) {
      throw new Error(`tool ${plan.tool} not among the loaded tools ${report.tools.join(', ')}`);
    }

    let nodeAttempt = 0;
    const State = Annotation.Root({ chargeId: Annotation() });
    const chargeNode = async () => {
      nodeAttempt += 1;
      const start = performance.now();
      const out = { what: `node attempt ${nodeAttempt}`, errorKind: '', chargeId: 0, replayed: null };
      report.attempts.push(out);
      let chargeId = 0;
      try {
        // A tool call (as a ToolNode makes it) returns a ToolMessage whose
        // artifact keeps the result's structuredContent and _meta.
        const msg = await tool.invoke({ type: 'tool_call', id: `call-${nodeAttempt}`, name: tool.name, args: plan.arguments });
        const artifacts = Array.isArray(msg.artifact) ? msg.artifact : [];
        const structured = artifacts.find((a) => a?.type === 'mcp_structured_content')?.data;
        const meta = artifacts.find((a) => a?.type === 'mcp_meta')?.data;
        if (typeof meta?.[CALL_META]?.replayed === 'boolean') {
          out.replayed = meta[CALL_META].replayed;
        }
        const text = textOf(msg.content);
        if (msg.status === 'error') {
          out.toolError = text;
          out.what += ': the tool call ended in an error message';
        } else {
          chargeId = chargeIdOf(structured, text, plan.chargeIdField);
          out.chargeId = chargeId;
          out.what += `: charge answered ${chargeId}${out.replayed ? ' (replayed)' : ''}`;
        }
      } catch (err) {
        const msg = String(err?.message ?? err);
        // The adapter throws a ToolException for an isError result.
        if (/returned an error:/.test(msg)) {
          out.toolError = msg;
        } else {
          out.errorKind = errorKind(err);
          out.error = msg;
        }
        out.ms = Math.round(performance.now() - start);
        out.nodeError = `${err?.name ?? 'Error'}: ${msg}`;
        out.what += `: the tool call threw (${msg}); the node raises it`;
        throw err;
      }
      out.ms = Math.round(performance.now() - start);
      if (nodeAttempt < plan.nodeAttempts) {
        const err = connectionError(nodeAttempt);
        out.nodeError = `${err.name}: ${err.message}`;
        out.what += `; then the node raised ${out.nodeError}`;
        throw err;
      }
      out.what += '; the node returned';
      return { chargeId };
    };
    const graph = new StateGraph(State)
      .addNode('charge', chargeNode, { retryPolicy: {} })
      .addEdge(START, 'charge')
      .addEdge('charge', END)
      .compile();
    try {
      const final = await graph.invoke({});
      report.graph = { ok: true, chargeId: final.chargeId ?? 0 };
    } catch (err) {
      // The graph gave up (retries exhausted or an error not retried): a
      // result of the run, not a broken run.
      report.graph = { ok: false, error: `${err?.name ?? 'Error'}: ${err?.message ?? err}` };
    }
    for (const a of report.attempts) {
      log(`${a.what} (${a.ms} ms)`);
    }
  } finally {
    await client.close();
  }
}

let code = 0;
try {
  const plan = readPlan(process.argv[2]);
  report.scenario = plan.scenario;
  report.keyed = Boolean(plan.key);
  for (const pkg of ['@langchain/langgraph', '@langchain/mcp-adapters', '@langchain/core', '@modelcontextprotocol/sdk']) {
    report.versions[pkg] = installedVersion(pkg);
  }
  report.versions.node = process.version;
  await run(plan);
} catch (err) {
  log(err instanceof UsageError ? err.message : (err?.stack ?? String(err)));
  report.error = String(err?.message ?? err);
  code = 2;
}
process.stdout.write(`${JSON.stringify(report)}\n`, () => process.exit(code));
