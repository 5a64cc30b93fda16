// The mcp-outbox upstream contract (schema/README.md) for a TypeScript or
// JavaScript tool server on better-sqlite3.
//
// `mcp-outbox proxy` records each side-effecting tools/call before forwarding
// it and hands the upstream a claim in _meta["io.github.mcp-outbox/claim"]. A
// cooperating upstream then writes the call's business rows, its outbox
// effects and its outcome in one SQLite transaction of its own, fenced by the
// claim's owner. This module is that transaction, written once:
//
//   import { openUpstream, textResult, ToolFailure } from './contract.mjs';
//
//   const up = openUpstream(process.env.MCP_OUTBOX_DB);
//   server.registerTool('charge', { ... }, async ({ customer, amount_cents }, extra) =>
//     up.runCall(extra._meta, (db, callId, now) => {      // inside BEGIN IMMEDIATE
//       if (amount_cents <= 0) throw new ToolFailure('amount out of range'); // recorded 'failed'
//       const chargeId = insertCharge.run(customer, amount_cents, callId, now).lastInsertRowid;
//       return {
//         result: textResult(`charged ${customer}`, { chargeId: Number(chargeId) }),
//         effects: [{ destination: 'payments', path: '/v1/charges', body: '...' }],
//       };
//     }));
//
// What runCall guarantees:
//   - one BEGIN IMMEDIATE transaction: the fence check first, then work's
//     writes (in a savepoint), its effects (idempotency keys <callId>-<n>)
//     and, for a claimed call, the outcome UPDATE, whose row count is checked;
//   - a call without a claim gets a fresh call id ("call_" + 24 hex digits)
//     and effects with call_id NULL;
//   - a lost claim (another attempt owns the call) rolls everything back and
//     answers the tool error "claim lost: ...";
//   - a ToolFailure thrown by work rolls back work's writes and records the
//     call as 'failed' with the tool error as its result; any other error
//     rolls back everything and is thrown on (the claim stays in_flight);
//   - the result is recorded as JSON exactly as answered, without _meta.
//
// better-sqlite3 is synchronous and a transaction function must not await:
// do slow work (waiting, network) before runCall, never in work. SQLite has
// one writer, and the proxy's claims wait for yours.

import { randomBytes } from 'node:crypto';

import Database from 'better-sqlite3';

// The _meta entry the proxy puts on a tools/call it has recorded.
export const CLAIM_META = 'io.github.mcp-outbox/claim';

// SetupError: the database is not ready for an upstream (not WAL, or no
// outbox tables).
export class SetupError extends Error {}

// ToolFailure is a tool error that is the call's outcome (recorded 'failed').
export class ToolFailure extends Error {}

// ClaimLost: the fence failed; another attempt owns the call now.
export class ClaimLost extends Error {
  constructor(claim) {
    super(
      `claim lost: call ${claim.callId} (row ${claim.rowId}) is no longer in flight under owner ` +
        `${JSON.stringify(claim.owner)}; another attempt took it over. Nothing was written.`,
    );
  }
}

// newCallId is a fresh call id for a call without a claim.
export function newCallId() {
  return 'call_' + randomBytes(12).toString('hex');
}

// textResult is a tools/call result with one text block.
export function textResult(text, structuredContent, isError = false) {
  const r = { content: [{ type: 'text', text }] };
  if (structuredContent !== undefined) {
    r.structuredContent = structuredContent;
  }
  r.isError = isError;
  return r;
}

// readClaim returns the claim in a request's _meta, or undefined. A
// malformed entry throws: answering it as unclaimed would run the call
// unfenced.
export function readClaim(meta) {
  const c = meta?.[CLAIM_META];
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

// recordedJSON is calls.result: the result without _meta.
function recordedJSON(result) {
  const { _meta, ...rest } = result;
  return JSON.stringify(rest);
}

// checkEffect rejects what the dispatcher could not send as meant.
function checkEffect(e) {
  const method = e.method ?? 'POST';
  if (typeof e.destination !== 'string' || e.destination === '') {
    throw new Error('effect without a destination');
  }
  if (typeof e.path !== 'string' || !e.path.startsWith('/')) {
    throw new Error(`effect path ${JSON.stringify(e.path)} does not start with /`);
  }
  if (method !== method.toUpperCase()) {
    throw new Error(`effect method ${JSON.stringify(method)}: want upper case, e.g. POST`);
  }
  for (const [k, v] of Object.entries(e.headers ?? {})) {
    if (typeof v !== 'string') {
      throw new Error('effect headers map strings to strings');
    }
    if (k.toLowerCase() === 'idempotency-key') {
      throw new Error("effect headers must not set Idempotency-Key: the dispatcher sends the effect's own");
    }
  }
}

// openUpstream opens the SQLite file shared with the proxy. It must exist,
// be in WAL mode and hold the outbox tables: the proxy creates them, this
// never does (SetupError otherwise). cooperate false ignores claims and
// writes business rows only, which is what an upstream that does not follow
// the contract does; it exists for tests.
//
// Returns { db, cooperate, claimOf(meta), runCall(meta, work), close() }:
// db for the upstream's own tables and statements, claimOf the claim it
// honours (none when not cooperating).
export function openUpstream(path, { cooperate = true } = {}) {
  // timeout is better-sqlite3's busy timeout: the proxy writes to this file too.
  const db = new Database(path, { fileMustExist: true, timeout: 5000 });
  try {
    db.pragma('busy_timeout = 5000');
    // better-sqlite3 is built with SQLITE_DEFAULT_WAL_SYNCHRONOUS=1 (NORMAL): ask
    // for FULL like the proxy, so that a commit survives a power loss.
    db.pragma('synchronous = FULL');
    db.pragma('foreign_keys = ON');
    if (db.pragma('journal_mode', { simple: true }) !== 'wal') {
      throw new SetupError(`${path} is not in WAL mode: start mcp-outbox proxy on it first`);
    }
    const outboxTables = db
      .prepare(`SELECT count(*) AS n FROM sqlite_master WHERE type = 'table' AND name IN ('calls', 'effects')`)
      .get().n;
    if (outboxTables !== 2) {
      throw new SetupError(`${path} has no outbox tables (calls, effects): mcp-outbox proxy creates them; start it first`);
    }
  } catch (err) {
    db.close();
    throw err;
  }

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
  };

  const claimOf = (meta) => (cooperate ? readClaim(meta) : undefined);

  // runCall runs one tool call in one BEGIN IMMEDIATE transaction: for a call
  // the proxy claimed, the fence check first; then work's business rows, the
  // effects it returns and, for a claimed call, its outcome. meta is the
  // request's _meta (extra._meta). work(db, callId, now) runs inside the
  // transaction and returns { result, effects }; effects are { destination,
  // method = 'POST', path, headers = {}, body } with body a string or bytes.
  // A ToolFailure it throws is the call's outcome: its writes are rolled back
  // (work runs in a savepoint) and the call is recorded as failed. Returns
  // the result to answer.
  function runCall(meta, work) {
    const claim = claimOf(meta);
    const callId = claim?.callId ?? newCallId();
    const business = db.transaction(work); // nested in txn: a SAVEPOINT
    const txn = db.transaction(() => {
      if (claim && stmts.fence.get({ rowId: claim.rowId, owner: claim.owner }) === undefined) {
        throw new ClaimLost(claim);
      }
      const now = Date.now();
      let result;
      let effects = [];
      try {
        ({ result, effects = [] } = business(db, callId, now));
        effects.forEach(checkEffect);
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
          body: e.body === undefined || e.body === null ? null : Buffer.from(e.body),
          key: `${callId}-${seq}`,
          now,
        });
      });
      if (claim) {
        const info = stmts.settle.run({
          state: result.isError ? 'failed' : 'completed',
          result: recordedJSON(result),
          now,
          rowId: claim.rowId,
          owner: claim.owner,
        });
        if (info.changes !== 1) {
          throw new ClaimLost(claim);
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

  return { db, cooperate, claimOf, runCall, close: () => db.close() };
}
