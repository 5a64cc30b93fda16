// Package sqlcexample shows code that sqlc generates for database/sql
// running inside outbox tool handlers: an [github.com/mcp-outbox/mcp-outbox/outbox.Tx] is the generated
// package's DBTX, so the generated queries run in the call's transaction
// and commit with its outcome, or not at all.
//
// sqlite/ticketsqlite and postgresql/ticketpg are sqlc's output for the
// schema and queries beside them (sqlc.yaml), one package per engine:
// SQLite's queries use ? placeholders, PostgreSQL's $N. Regenerate them
// with `make sqlc`; `make sqlc/check` fails if they differ from what the
// pinned sqlc (tools/go.mod) generates.
package sqlcexample
