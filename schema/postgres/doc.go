// Package postgres links PostgreSQL into mcp-outbox: importing it, for its
// side effect, registers the store that lets [schema.Open] open a
// postgres:// or postgresql:// URL, through pgx's database/sql driver
// ("pgx"); and [FromPool] and [FromDB] hand the layer a pgx pool or a
// *sql.DB that the program configures itself.
//
//	import _ "github.com/mcp-outbox/mcp-outbox/schema/postgres"
//
// Only a program that imports it links pgx: one that uses SQLite alone
// stays without it. The outbox's SQL for PostgreSQL, its migrations
// included, is in package schema with SQLite's and chosen by
// [schema.DB.Dialect]; what is here is what only the client library can
// do: build the connection string, read pgx's errors, and hold the
// connection that LISTENs for new effects.
//
// Every connection is bounded on the network (see DefaultConnectTimeout
// and the constants after it): a connect timeout, TCP keepalive and
// TCP_USER_TIMEOUT on both ends, so that a partition that drops packets
// fails a connection within seconds instead of hanging it. libpq's URL
// settings connect_timeout, keepalives, keepalives_idle,
// keepalives_interval, keepalives_count and tcp_user_timeout override the
// defaults.
//
// An instrumented pool works as it is: register a driver that wraps
// "pgx" (otelsql.Register("pgx") returns its name) and give that name as
// [schema.Options].Driver. The dialect comes from the URL, so every
// statement is PostgreSQL's whatever the driver's type.
//
// # How the layer runs on PostgreSQL
//
// The invariant is the same: a call's writes, its effects and its outcome
// commit in one transaction, as long as the tool's own tables live in the
// same database. What differs, and why:
//
//   - No group commit. Each unit (a claim, an outcome, a release) is a
//     transaction of its own on a pooled connection: PostgreSQL runs them
//     side by side and shares WAL flushes among concurrent commits itself.
//     A claim or a release commits with synchronous_commit off, the
//     counterpart of SQLite's relaxed claims.
//   - Round trips, not CPU, are what a call costs across a network, so
//     each step takes as few as it can. On pgx's own database/sql driver
//     the claim of a fresh key, for a call whose lost claim may simply run
//     again (on_lost 'rerun', the default), is no transaction of its own:
//     it is the first statement of the call's transaction, sent with BEGIN
//     (INSERT … ON CONFLICT DO NOTHING, and the read of the row it found).
//     The handler's statements follow, one round trip each, and the
//     outcome (with the call's effects, inserted by the outcome's
//     statement, not at Enqueue) goes with COMMIT: three round trips and
//     one commit for a fresh key. The outcome's compare-and-set fails
//     unless it matched one row, so that the COMMIT sent behind it keeps
//     nothing. A key that is not fresh is answered from the row read in
//     that first round trip when the answer writes nothing (a replay, a
//     conflict, a live owner elsewhere): one round trip of latency; the
//     transaction, which wrote nothing, rolls back behind the answer.
//     Durable claims (on_lost 'unknown', tasks) and the claims a
//     cooperating upstream reads commit on their own first, in one
//     statement. Through a driver that wraps pgx's ([schema.Options].Driver:
//     tracing, fault injection) each statement goes alone, as
//     database/sql sends it, and the claim commits on its own: six.
//   - What the claim in the call's transaction changes. The uncommitted
//     insert holds the key at the unique index: a duplicate on any
//     replica waits there, no longer than its in-flight wait (its
//     lock_timeout), and then replays the committed outcome (a join), runs
//     the call if the original rolled back, or answers in_progress. Only
//     the call's own transaction can ever commit the row, with its
//     outcome, so the row is its own fence: nobody can take the call over,
//     and no lease needs renewing. A crash, kill or partition before
//     COMMIT leaves no row at all, so a retry runs the call at once, as
//     the rerun policy allows for a lost claim. The status tool of another
//     process cannot see the uncommitted row: it answers not_found until
//     the outcome commits (the running process answers in_flight); a
//     retry that prompts waits at the key, as above. The transaction is
//     bounded by the lease, set with the claim: PostgreSQL ends a session
//     idle in it for a lease (idle_in_transaction_session_timeout: a
//     paused replica, or one cut off by a link that swallows packets), and
//     any lock wait of it longer than a lease, so a silent
//     replica holds a key, and keeps a duplicate waiting, for at most a
//     lease, and commits nothing once its session is gone. A live handler
//     that works outside the database for longer than the lease between
//     its statements keeps its call: every third of the lease, the
//     renewal loop sends SELECT 1 in its transaction if that has been
//     quiet for half of that. It cannot while the handler holds
//     *sql.Rows open on the connection, so a handler that
//     waits longer than the lease with rows open loses its call: read
//     them to the end, or close them, before a slow wait.
//   - Claims are compare-and-set writes. Replicas claim at the same time,
//     so every transition of a call row names the state it read (and, for
//     a takeover or an abandoned forwarded call, the owner): a write that
//     finds the row changed changes nothing, and the claim reads the row
//     again. Two inserts of one key meet at the unique index; the loser
//     reads the winner's row.
//   - Ownership by lease, not by /proc, for claims that are committed
//     rows (durable claims, takeovers, and every claim through a wrapping
//     driver). A replica cannot see another
//     machine's processes, so every owner but the layer's own attempts is
//     trusted for exactly its lease. A layer renews the leases of its
//     claimed attempts every third of the lease, in one statement, until
//     the handler's first statement. From that statement until the
//     outcome commits the attempt's transaction holds the call row's lock
//     (the fence is SELECT ... FOR UPDATE), so no other attempt can take
//     the call over meanwhile; one that tries waits behind the lock,
//     bounded by its in-flight wait, and then finds the outcome. An
//     attempt whose lease passed before its first statement (its process
//     was paused, or cut off, longer than the lease) does not commit, even
//     if nobody took the call over; and one whose call was taken over
//     fails the fence. So a paused replica that resumes never commits a
//     call another replica ran.
//   - Clocks. Leases, due times and expiries are written and judged in
//     the database server's clock, not the replicas': a layer and a
//     dispatcher sample PostgreSQL's clock_timestamp() when they start
//     (and every few minutes after) and count from it by the process's
//     monotonic clock. So a replica whose clock is minutes off neither
//     takes a live claim over early nor waits past an abandoned one, and
//     a step of a machine's wall clock changes nothing. Even a clock that
//     is wrong would change only when a takeover happens, never whether
//     two attempts can both commit: that is decided by the owner in the
//     row, under its lock.
//   - Waiting. A duplicate on another replica cannot be woken by the
//     original: it polls the row with backoff, as one in another process
//     does on SQLite.
//   - A handler statement that fails ends PostgreSQL's transaction: the
//     handler gets the error and should return it; further statements
//     fail until the layer rolls the call's transaction back.
//   - A lost answer to COMMIT (the connection broke while PostgreSQL
//     committed) leaves the outcome unknown to the attempt: it reads the
//     call's row again, and answers the result if its outcome is there,
//     not_recorded if not, and in_progress, saying what a retry does, if
//     the row cannot be read.
//   - Effects: every replica's [github.com/mcp-outbox/mcp-outbox/outbox/dispatch.Dispatcher] delivers. Each due effect is
//     leased by exactly one of them (FOR UPDATE SKIP LOCKED, with the
//     state checked again by the leasing UPDATE); a call's effects keep
//     their order, since effect n+1 is due only once n is committed as
//     delivered or cancelled. Dispatchers wake on LISTEN
//     mcp_outbox_effects (a trigger notifies when effects are inserted)
//     and poll as a fallback. An effect leased by a replica that died
//     returns when its lease passes: no /proc here either. Reclaiming
//     leases and purging are conditional statements (purge batches lock
//     with SKIP LOCKED), safe when every replica runs them at once.
package postgres
