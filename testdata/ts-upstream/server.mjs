// A real upstream MCP tool server for `mcp-outbox proxy`: a small payments
// ledger on the official TypeScript SDK and better-sqlite3, sharing its SQLite
// file with the proxy and following the contract in schema/README.md. The Go
// tests run it directly (cmd/mcp-outbox/upstream_contract_test.go) and behind
// the proxy.
//
// Usage: node server.mjs   (stdio; Streamable HTTP with UPSTREAM_HTTP_PORT)
//
// Environment:
//   MCP_OUTBOX_DB                           the shared SQLite file (required). The
//                                           proxy creates the outbox tables first;
//                                           this server never creates or alters them.
//   UPSTREAM_COOPERATE                      "1" (default): record each claimed call's
//                                           outcome and effects in the call's own
//                                           transaction; "0": ignore the claim and
//                                           write business rows only.
//   UPSTREAM_CRASH_ONCE_FILE                if this file exists when a charge has
//                                           committed: delete it, then SIGKILL this
//                                           process before answering.
//   UPSTREAM_CRASH_BEFORE_COMMIT_ONCE_FILE  the same, in the handler before the
//                                           charge's transaction begins.
//   UPSTREAM_CHARGE_DELAY_MS                make charge (and slow_charge after its own
//                                           wait) wait this many milliseconds before its
//                                           transaction, to simulate slow work. The wait
//                                           does not end when the call is cancelled: the
//                                           charge then still tries to commit, and the
//                                           fence decides. Default 0.
//   UPSTREAM_HTTP_PORT                      serve Streamable HTTP (stateful sessions)
//                                           on 127.0.0.1:PORT at /mcp instead of
//                                           stdio; 0 picks a free port.
//
// Once serving, it prints one line to stderr:
//   ts-upstream ready pid=<pid> cooperate=<0|1>[ url=http://127.0.0.1:<port>/mcp]

import { randomBytes, randomUUID } from 'node:crypto';
import { existsSync, unlinkSync } from 'node:fs';
import { createServer } from 'node:http';
import { setTimeout as delay } from 'node:timers/promises';

import Database from 'better-sqlite3';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import * as z from 'zod';

// The _meta entry the proxy puts on a tools/call it has recorded.
const CLAIM_META = 'io.github.mcp-outbox/claim';

const MAX_AMOUNT_CENTS = 1_000_000;

function fail(msg) {
  process.stderr.write(`ts-upstream: ${msg}\n`);
  process.exit(2);
}

const dbPath = process.env.MCP_OUTBOX_DB;
if (!dbPath) {
  fail('MCP_OUTBOX_DB is required: the path of the SQLite file shared with mcp-outbox proxy');
}
const cooperateEnv = process.env.UPSTREAM_COOPERATE ?? '1';
if (cooperateEnv !== '0' && cooperateEnv !== '1') {
  fail(`UPSTREAM_COOPERATE=${JSON.stringify(cooperateEnv)}: want 0 or 1`);
}
const cooperate = cooperateEnv === '1';
const crashAfterCommitFile = process.env.UPSTREAM_CRASH_ONCE_FILE || '';
const crashBeforeCommitFile = process.env.UPSTREAM_CRASH_BEFORE_COMMIT_ONCE_FILE || '';
const httpPort = process.env.UPSTREAM_HTTP_PORT;
const chargeDelayEnv = process.env.UPSTREAM_CHARGE_DELAY_MS || '0';
const chargeDelayMs = Number(chargeDelayEnv);
if (!Number.isInteger(chargeDelayMs) || chargeDelayMs < 0) {
  fail(`UPSTREAM_CHARGE_DELAY_MS=${JSON.stringify(chargeDelayEnv)}: want a number of milliseconds`);
}

// --- database ---------------------------------------------------------------

const db = new Database(dbPath, { fileMustExist: true, timeout: 5000 });
db.pragma('busy_timeout = 5000');
// better-sqlite3 is built with SQLITE_DEFAULT_WAL_SYNCHRONOUS=1 (NORMAL): ask
// for FULL like the proxy, so that a commit survives a power loss.
db.pragma('synchronous = FULL');
db.pragma('foreign_keys = ON');
if (db.pragma('journal_mode', { simple: true }) !== 'wal') {
  fail(`${dbPath} is not in WAL mode: start mcp-outbox proxy on it first`);
}
const outboxTables = db
  .prepare(`SELECT count(*) AS n FROM sqlite_master WHERE type = 'table' AND name IN ('calls', 'effects')`)
  .get().n;
if (outboxTables !== 2) {
  fail(`${dbPath} has no outbox tables (calls, effects): mcp-outbox proxy creates them; start it first`);
}

// Business tables: this server's own. (The outbox tables are the proxy's.)
db.exec(`
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
`);

const stmts = {
  // The fence, checked first: is the claim still ours? (BEGIN IMMEDIATE holds
  // the write lock, so no one can take the call over until the commit.)
  fence: db.prepare(`SELECT 1 FROM calls WHERE id = @rowId AND owner = @owner AND state = 'in_flight'`),
  // The outcome, written last (the result depends on the business rows),
  // under the same condition.
  settle: db.prepare(`
    UPDATE calls SET state = @state, result = @result, completed_at = @now, owner = '', lease_until = 0
    WHERE id = @rowId AND owner = @owner AND state = 'in_flight'`),
  insertEffect: db.prepare(`
    INSERT INTO effects (call_id, seq, destination, method, path, headers, body, idempotency_key,
                         next_attempt_at, created_at, updated_at)
    VALUES (@callRowId, @seq, @destination, @method, @path, @headers, @body, @key, @now, @now, @now)`),
  insertCharge: db.prepare(`
    INSERT INTO charges (customer, amount_cents, call_id, created_at) VALUES (?, ?, ?, ?)`),
  balance: db.prepare(`SELECT coalesce(sum(amount_cents), 0) AS cents, count(*) AS n FROM charges WHERE customer = ?`),
  upsertNickname: db.prepare(`
    INSERT INTO nicknames (customer, nickname, updated_at) VALUES (?, ?, ?)
    ON CONFLICT (customer) DO UPDATE SET nickname = excluded.nickname, updated_at = excluded.updated_at`),
  ledger: db.prepare(`SELECT id, customer, amount_cents, call_id FROM charges ORDER BY id`),
};

// --- the contract -----------------------------------------------------------

// ToolFailure is a tool error that is the call's outcome (recorded 'failed').
class ToolFailure extends Error {}

// ClaimLost: the fence failed; another attempt owns the call now.
class ClaimLost extends Error {}

function newCallId() {
  return 'call_' + randomBytes(12).toString('hex');
}

function textResult(text, structuredContent, isError = false) {
  const r = { content: [{ type: 'text', text }] };
  if (structuredContent !== undefined) {
    r.structuredContent = structuredContent;
  }
  r.isError = isError;
  return r;
}

// readClaim returns the claim the proxy attached to this call, or undefined.
function readClaim(extra) {
  const c = extra._meta?.[CLAIM_META];
  if (c === undefined) {
    return undefined;
  }
  if (
    c === null || typeof c !== 'object' ||
    typeof c.key !== 'string' ||
    typeof c.callId !== 'string' || c.callId === '' ||
    !Number.isSafeInteger(c.rowId) ||
    typeof c.owner !== 'string' || c.owner === ''
  ) {
    throw new Error(`malformed ${CLAIM_META} entry in _meta: ${JSON.stringify(c)}`);
  }
  return c;
}

// runCall runs one tool call in one BEGIN IMMEDIATE transaction: for a call
// the proxy claimed, the fence check first; then work's business rows, the
// effects it returns and, for a claimed call, its outcome. work(callId, now) runs inside the
// transaction and returns { result, effects }; a ToolFailure it throws is the
// call's outcome: its writes are rolled back (work runs in a savepoint) and
// the call is recorded as failed. Returns the result to answer.
function runCall(extra, work) {
  const claim = cooperate ? readClaim(extra) : undefined;
  const callId = claim?.callId ?? newCallId();
  const business = db.transaction(work); // nested in txn: a SAVEPOINT
  const lost = () =>
    new ClaimLost(
      `claim lost: call ${claim.callId} (row ${claim.rowId}) is no longer in flight under owner ` +
        `${JSON.stringify(claim.owner)}; another attempt took it over. Nothing was written.`,
    );
  const txn = db.transaction(() => {
    if (claim && stmts.fence.get({ rowId: claim.rowId, owner: claim.owner }) === undefined) {
      throw lost();
    }
    const now = Date.now();
    let result;
    let effects = [];
    try {
      ({ result, effects = [] } = business(callId, now));
    } catch (err) {
      if (!(err instanceof ToolFailure)) {
        throw err;
      }
      result = textResult(err.message, undefined, true);
      effects = [];
    }
    if (!cooperate) {
      return result; // business rows only
    }
    effects.forEach((e, i) => {
      const seq = i + 1;
      stmts.insertEffect.run({
        callRowId: claim ? claim.rowId : null,
        seq,
        destination: e.destination,
        method: e.method ?? 'POST',
        path: e.path,
        headers: JSON.stringify(e.headers ?? {}),
        body: e.body === undefined ? null : Buffer.from(e.body),
        key: `${callId}-${seq}`,
        now,
      });
    });
    if (claim) {
      const info = stmts.settle.run({
        state: result.isError ? 'failed' : 'completed',
        result: JSON.stringify(result),
        now,
        rowId: claim.rowId,
        owner: claim.owner,
      });
      if (info.changes !== 1) {
        throw lost();
      }
    }
    return result;
  });
  try {
    return txn.immediate();
  } catch (err) {
    if (err instanceof ClaimLost) {
      return textResult(err.message, undefined, true);
    }
    throw err; // the SDK answers a tool error; nothing was written
  }
}

// crashOnce SIGKILLs this process if file exists, deleting it first.
function crashOnce(file, when) {
  if (file && existsSync(file)) {
    unlinkSync(file);
    process.stderr.write(`ts-upstream: crashing ${when} (pid ${process.pid})\n`);
    process.kill(process.pid, 'SIGKILL');
  }
}

async function charge(extra, customer, amountCents) {
  crashOnce(crashBeforeCommitFile, 'before the commit of a charge');
  if (chargeDelayMs > 0) {
    // Slow work (UPSTREAM_CHARGE_DELAY_MS), deliberately deaf to cancellation.
    await delay(chargeDelayMs);
  }
  const result = runCall(extra, (callId, now) => {
    if (amountCents <= 0 || amountCents > MAX_AMOUNT_CENTS) {
      throw new ToolFailure('amount out of range');
    }
    const chargeId = Number(stmts.insertCharge.run(customer, amountCents, callId, now).lastInsertRowid);
    return {
      result: textResult(`charged ${customer} ${amountCents} (charge ${chargeId})`, {
        chargeId,
        customer,
        amount_cents: amountCents,
      }),
      effects: [
        {
          destination: 'payments',
          method: 'POST',
          path: '/v1/charges',
          headers: { 'Content-Type': 'application/json' },
          body: JSON.stringify({ customer, amount_cents: amountCents, charge_id: chargeId }),
        },
      ],
    };
  });
  if (!result.isError) {
    crashOnce(crashAfterCommitFile, 'after the commit of a charge');
  }
  return result;
}

// sleep waits ms, or rejects when the request is cancelled.
function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    if (signal.aborted) {
      reject(new Error('cancelled'));
      return;
    }
    const t = setTimeout(() => {
      signal.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    function onAbort() {
      clearTimeout(t);
      reject(new Error('cancelled'));
    }
    signal.addEventListener('abort', onAbort, { once: true });
  });
}

// --- the MCP server ---------------------------------------------------------

const chargeInput = {
  customer: z.string().min(1).describe('Who to charge'),
  // Range-checked by the handler, not the schema: an out-of-range amount is a
  // recorded tool error ('failed'), while a schema violation is answered by
  // the SDK before the handler runs and records nothing.
  amount_cents: z.number().int().describe(`Amount in cents, 1 to ${MAX_AMOUNT_CENTS}`),
};
const chargeOutput = {
  chargeId: z.number().int(),
  customer: z.string(),
  amount_cents: z.number().int(),
};

function newServer() {
  const server = new McpServer({ name: 'mcp-outbox-ts-upstream', version: '0.0.0' });

  server.registerTool(
    'charge',
    {
      description: 'Charge a customer: writes a charge and queues a payment request to the payments API.',
      inputSchema: chargeInput,
      outputSchema: chargeOutput,
    },
    async ({ customer, amount_cents }, extra) => charge(extra, customer, amount_cents),
  );

  server.registerTool(
    'slow_charge',
    {
      description:
        'Like charge, but waits delay_ms first (reporting progress when asked); a cancelled call charges nothing.',
      inputSchema: {
        ...chargeInput,
        delay_ms: z.number().int().min(0).max(600_000).describe('Milliseconds to wait before charging'),
      },
      outputSchema: chargeOutput,
    },
    async ({ customer, amount_cents, delay_ms }, extra) => {
      const progressToken = extra._meta?.progressToken;
      if (progressToken !== undefined) {
        await extra.sendNotification({
          method: 'notifications/progress',
          params: { progressToken, progress: 1, total: 2, message: `waiting ${delay_ms} ms before charging` },
        });
      }
      await sleep(delay_ms, extra.signal);
      if (extra.signal.aborted) {
        throw new Error('cancelled');
      }
      return charge(extra, customer, amount_cents);
    },
  );

  server.registerTool(
    'get_balance',
    {
      description: 'The sum of a customer\'s charges, in cents.',
      inputSchema: { customer: z.string().min(1) },
      outputSchema: { customer: z.string(), balance_cents: z.number().int(), charges: z.number().int() },
      annotations: { readOnlyHint: true },
    },
    async ({ customer }, extra) => {
      const read = () => {
        const { cents, n } = stmts.balance.get(customer);
        return textResult(`balance ${customer} ${cents} (${n} charges)`, {
          customer,
          balance_cents: cents,
          charges: n,
        });
      };
      if ((cooperate ? readClaim(extra) : undefined) === undefined) {
        return read(); // not recorded: a plain read
      }
      return runCall(extra, () => ({ result: read() }));
    },
  );

  server.registerTool(
    'set_nickname',
    {
      description: 'Set the nickname of a customer (the last one set wins).',
      inputSchema: { customer: z.string().min(1), nickname: z.string().min(1) },
      annotations: { idempotentHint: true, destructiveHint: false },
    },
    async ({ customer, nickname }, extra) =>
      runCall(extra, (callId, now) => {
        stmts.upsertNickname.run(customer, nickname, now);
        return { result: textResult(`nickname of ${customer} is ${nickname}`) };
      }),
  );

  server.registerResource(
    'ledger',
    'ledger://charges',
    { title: 'Ledger', description: 'Every charge, one per line.', mimeType: 'text/plain' },
    async (uri) => {
      const rows = stmts.ledger.all();
      const text =
        rows.length === 0
          ? 'no charges\n'
          : rows.map((r) => `charge ${r.id} ${r.customer} ${r.amount_cents} ${r.call_id}\n`).join('');
      return { contents: [{ uri: uri.href, mimeType: 'text/plain', text }] };
    },
  );

  server.registerPrompt(
    'summarize_charges',
    {
      description: 'Ask for a summary of the charges, optionally of one customer.',
      argsSchema: { customer: z.string().optional().describe('Only this customer\'s charges') },
    },
    ({ customer }) => ({
      messages: [
        {
          role: 'user',
          content: {
            type: 'text',
            text: customer
              ? `Summarize the charges of ${customer} in the resource ledger://charges.`
              : 'Summarize the charges in the resource ledger://charges.',
          },
        },
      ],
    }),
  );

  return server;
}

// --- transports -------------------------------------------------------------

function ready(extra = '') {
  process.stderr.write(
    `ts-upstream ready pid=${process.pid} cooperate=${cooperate ? 1 : 0}${extra}\n`,
  );
}

function shutdown() {
  try {
    db.close();
  } finally {
    process.exit(0);
  }
}
process.on('SIGTERM', shutdown);
process.on('SIGINT', shutdown);

if (httpPort === undefined || httpPort === '') {
  const server = newServer();
  const transport = new StdioServerTransport();
  process.stdin.on('end', shutdown);
  await server.connect(transport);
  ready();
} else {
  const port = Number(httpPort);
  if (!Number.isInteger(port) || port < 0 || port > 65535) {
    fail(`UPSTREAM_HTTP_PORT=${JSON.stringify(httpPort)}: want a port number`);
  }
  const sessions = new Map(); // session id -> transport
  const http = createServer(async (req, res) => {
    try {
      const url = new URL(req.url ?? '/', 'http://127.0.0.1');
      if (url.pathname !== '/mcp') {
        res.writeHead(404, { 'Content-Type': 'text/plain' }).end('not found\n');
        return;
      }
      const sid = req.headers['mcp-session-id'];
      if (typeof sid === 'string' && sid !== '') {
        const transport = sessions.get(sid);
        if (!transport) {
          res.writeHead(404, { 'Content-Type': 'application/json' }).end(
            JSON.stringify({ jsonrpc: '2.0', error: { code: -32001, message: 'Session not found' }, id: null }),
          );
          return;
        }
        await transport.handleRequest(req, res);
        return;
      }
      // No session: a new one, which the transport accepts only for an
      // initialize request.
      const transport = new StreamableHTTPServerTransport({
        sessionIdGenerator: () => randomUUID(),
        onsessioninitialized: (id) => sessions.set(id, transport),
      });
      transport.onclose = () => {
        if (transport.sessionId) {
          sessions.delete(transport.sessionId);
        }
      };
      await newServer().connect(transport);
      await transport.handleRequest(req, res);
    } catch (err) {
      process.stderr.write(`ts-upstream: ${req.method} ${req.url}: ${err?.stack ?? err}\n`);
      if (!res.headersSent) {
        res.writeHead(500, { 'Content-Type': 'text/plain' }).end('internal error\n');
      }
    }
  });
  http.listen(port, '127.0.0.1', () => {
    ready(` url=http://127.0.0.1:${http.address().port}/mcp`);
  });
}
