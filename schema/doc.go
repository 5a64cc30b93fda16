// Package schema opens the database the layer records in: [Open] takes
// an SQLite file or a postgres:// URL, sets what the guarantees rely on,
// and applies the embedded, numbered migrations that create the outbox
// tables (a program's own handle goes through schema/sqlite.FromDB or
// schema/postgres.FromPool instead). SQLite (one file, modernc.org/sqlite)
// is the embedded default; PostgreSQL (pgx through database/sql) is the
// store that several replicas share.
//
// # PostgreSQL
//
// PostgreSQL is linked only into a program that imports its store, for
// the side effect:
//
//	import _ "github.com/mcp-outbox/mcp-outbox/schema/postgres"
//
// A program of SQLite alone leaves the import out and links no pgx; there
// [Open] refuses a postgres:// URL with an error that names the import.
// The core speaks both dialects' SQL and chooses by [DB.Dialect], which
// comes from the target opened, never from the driver's type; what only a
// client library can do (read its errors, hold a listening connection) a
// [Store] does, and the core asks the DB ([DB.Unavailable],
// [DB.CommitRolledBack], [DB.Listen]).
//
// [Open] with a postgres:// or postgresql:// URL opens a pool of
// connections (Write and Read are the same pool) to an existing database
// and applies the outbox migrations of migrations_postgres/: the same
// tables, columns and states, in PostgreSQL's types. Migrations run in one
// transaction under an advisory lock, so replicas that start together
// apply each one once. Durability maps to synchronous_commit (full: on;
// normal: off). The statements of the project are written once, with $N
// placeholders, which modernc.org/sqlite binds by number as PostgreSQL
// does; the few that cannot be the same text are chosen with [DB.Pick].
// Applications give their own migrations per dialect ([DB.MigrationsFor]).
// The URL's password never appears in errors or logs (DB.Path is the URL
// without it).
//
// # Instrumented drivers
//
// A driver that wraps the store's own (otelsql, or any other registered
// under a name of its own) is given as [Options].Driver; it must take the
// DSN of the driver it wraps. Since the dialect comes from the target, the
// wrapper changes nothing but what it observes.
//
// # Opening
//
// [Open] returns a [DB] with two handles on the same file. Write holds a single
// connection whose transactions begin IMMEDIATE, so a transaction takes
// SQLite's write lock at BEGIN instead of failing with SQLITE_BUSY on its first
// write when another writer got there first. Read is a small pool for queries.
// Every connection runs in WAL mode with a busy timeout and foreign keys on.
//
// # Durability
//
// [DurabilityFull] (the default) sets synchronous=FULL: a commit has reached
// the disk when it returns, so a committed call survives a power loss.
// [DurabilityNormal] sets synchronous=NORMAL: in WAL mode a commit survives a
// crash of the process, but the last commits before a power loss or an
// operating-system crash may be rolled back. Measured on this project's
// 2-core machine: about 210 µs per FULL commit and 21 µs per NORMAL commit.
//
// # Files
//
// A database is three files: the main file (the path given), its -wal (the
// log every commit is appended to) and its -shm (an index of the log,
// rebuilt from the log by the first connection that opens the database).
// A commit is durable once it is in the -wal; SQLite copies committed pages
// into the main file at checkpoints, and a clean close checkpoints
// everything and deletes the -wal.
//
// So the -wal is part of the database, not a cache. Copy, move or back up
// the three together, with no process running, or use SQLite's backup API
// ('sqlite3 FILE ".backup COPY"'). Deleting the -wal after a stop that did
// not checkpoint (a crash, SIGKILL, a power loss) rolls the database back
// to its last checkpoint: every commit since is gone, as if it had never
// happened. For the outbox that means: a call committed before that
// checkpoint is still recorded (a retry replays it); a call whose commit was
// only in the lost log is forgotten, so a retry runs it again, as a new call
// with a new call id, and its effects carry new Idempotency-Keys, so an
// effect the lost call had already delivered is delivered again. Deleting
// the -wal of a process that stopped in the middle of a checkpoint can
// leave the main file with some pages newer than others: check it with
// PRAGMA integrity_check before serving. A stale -shm is harmless; it is
// rebuilt.
//
// A main file that is not a database, or one cut short, is refused by
// [Open] with an error naming it, before anything is written to it.
//
// # Migrations
//
// Migrations are files named NNN_description.up.sql, embedded in the binary.
// [Open] applies the outbox set; an application adds its own tables with
// [DB.Migrate] under a set name of its own. Each set's applied versions are
// recorded in schema_migrations. A set with a gap or a duplicate version is
// refused. Migrating runs inside one IMMEDIATE transaction that re-reads the
// applied versions after taking the write lock, so two processes opening the
// same new file at once apply each migration exactly once. Foreign key
// enforcement is off while migrations run, so that a migration can rebuild a
// table by SQLite's documented procedure without firing the ON DELETE actions
// of the tables that refer to it; PRAGMA foreign_key_check must then find no
// violation before the transaction commits, and enforcement is back on
// before the connection serves anything else.
package schema
