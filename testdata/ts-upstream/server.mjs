// A real upstream MCP tool server for `mcp-outbox proxy`: a small payments
// ledger on the official TypeScript SDK and better-sqlite3, sharing its SQLite
// file with the proxy and following the contract in schema/README.md. The Go
// tests run it directly (cmd/mcp-outbox/e2e/upstream_contract_test.go) and behind
// the proxy. The contract itself is contract.mjs.
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
//   UPSTREAM_ANNOUNCE_CHARGES               "1": print "ts-upstream: charge started"
//                                           and "ts-upstream: charge ended" to stderr
//                                           around each charge, so that a test knows
//                                           a forwarded call has arrived (or is done)
//                                           without sleeping on a guess. Default off.
//   UPSTREAM_HTTP_PORT                      serve Streamable HTTP (stateful sessions)
//                                           on 127.0.0.1:PORT at /mcp instead of
//                                           stdio; 0 picks a free port.
//
// Once serving, it prints one line to stderr:
//   ts-upstream ready pid=<pid> cooperate=<0|1>[ url=http://127.0.0.1:<port>/mcp]

import { randomUUID } from 'node:crypto';
import { existsSync, unlinkSync } from 'node:fs';
import { createServer } from 'node:http';
import { setTimeout as delay } from 'node:timers/promises';

import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import * as z from 'zod';

import { openUpstream, SetupError, textResult, ToolFailure } from './contract.mjs';

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
const announceCharges = process.env.UPSTREAM_ANNOUNCE_CHARGES === '1';
const chargeDelayEnv = process.env.UPSTREAM_CHARGE_DELAY_MS || '0';
const chargeDelayMs = Number(chargeDelayEnv);
if (!Number.isInteger(chargeDelayMs) || chargeDelayMs < 0) {
  fail(`UPSTREAM_CHARGE_DELAY_MS=${JSON.stringify(chargeDelayEnv)}: want a number of milliseconds`);
}

// --- database ---------------------------------------------------------------

// The contract (fence, effects, outcome in one transaction) is contract.mjs.
let up;
try {
  up = openUpstream(dbPath, { cooperate });
} catch (err) {
  if (!(err instanceof SetupError)) {
    throw err;
  }
  fail(err.message);
}
const db = up.db;

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
  insertCharge: db.prepare(`
    INSERT INTO charges (customer, amount_cents, call_id, created_at) VALUES (?, ?, ?, ?)`),
  balance: db.prepare(`SELECT coalesce(sum(amount_cents), 0) AS cents, count(*) AS n FROM charges WHERE customer = ?`),
  upsertNickname: db.prepare(`
    INSERT INTO nicknames (customer, nickname, updated_at) VALUES (?, ?, ?)
    ON CONFLICT (customer) DO UPDATE SET nickname = excluded.nickname, updated_at = excluded.updated_at`),
  ledger: db.prepare(`SELECT id, customer, amount_cents, call_id FROM charges ORDER BY id`),
};

// crashOnce SIGKILLs this process if file exists, deleting it first.
function crashOnce(file, when) {
  if (file && existsSync(file)) {
    unlinkSync(file);
    process.stderr.write(`ts-upstream: crashing ${when} (pid ${process.pid})\n`);
    process.kill(process.pid, 'SIGKILL');
  }
}

async function charge(extra, customer, amountCents) {
  if (!announceCharges) {
    return chargeOnce(extra, customer, amountCents);
  }
  process.stderr.write('ts-upstream: charge started\n');
  try {
    return await chargeOnce(extra, customer, amountCents);
  } finally {
    process.stderr.write('ts-upstream: charge ended\n');
  }
}

async function chargeOnce(extra, customer, amountCents) {
  crashOnce(crashBeforeCommitFile, 'before the commit of a charge');
  if (chargeDelayMs > 0) {
    // Slow work (UPSTREAM_CHARGE_DELAY_MS), deliberately deaf to cancellation.
    await delay(chargeDelayMs);
  }
  const result = up.runCall(extra._meta, (_db, callId, now) => {
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
      if (up.claimOf(extra._meta) === undefined) {
        return read(); // not recorded: a plain read
      }
      return up.runCall(extra._meta, () => ({ result: read() }));
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
      up.runCall(extra._meta, (_db, _callId, now) => {
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
