package outbox

import (
	"errors"
	"strings"
	"testing"

	"github.com/mcp-outbox/mcp-outbox/schema"
)

func TestCheckStatements(t *testing.T) {
	t.Parallel()
	const (
		both   = "both"
		sqlite = "sqlite"
		pg     = "postgres"
	)
	tests := []struct {
		name    string
		dialect string
		q       string
		refused string // a word of the expected refusal's statement; "" means allowed
	}{
		{"Insert", both, `INSERT INTO t (a) VALUES ($1) RETURNING id`, ""},
		{"Select", both, `SELECT 1`, ""},
		{"Empty", both, ``, ""},
		{"OnlySemicolons", both, ` ;; ;`, ""},
		{"Commit", both, `COMMIT`, "COMMIT"},
		{"CommitLower", both, `commit`, "commit"},
		{"CommitMixed", both, `CoMmIt TRANSACTION`, "CoMmIt"},
		{"End", both, `END`, "END"},
		{"EndTransaction", both, `end transaction`, "end"},
		{"Begin", both, `BEGIN`, "BEGIN"},
		{"BeginImmediate", sqlite, `BEGIN IMMEDIATE`, "BEGIN"},
		{"StartTransaction", both, `START TRANSACTION`, "START"},
		{"Rollback", both, `ROLLBACK`, "ROLLBACK"},
		{"RollbackTo", both, `ROLLBACK TO unit`, "ROLLBACK"},
		{"Abort", both, `ABORT`, "ABORT"},
		{"Savepoint", both, `SAVEPOINT s`, "SAVEPOINT"},
		{"Release", both, `RELEASE unit`, "RELEASE"},
		{"Attach", sqlite, `ATTACH DATABASE 'x.db' AS x`, "ATTACH"},
		{"Detach", sqlite, `DETACH x`, "DETACH"},
		{"Vacuum", both, `VACUUM`, "VACUUM"},
		{"VacuumInto", sqlite, `VACUUM INTO '/tmp/copy.db'`, "VACUUM"},
		{"PrepareTransaction", pg, `PREPARE TRANSACTION 'x'`, "PREPARE"},
		{"CommitPrepared", pg, `COMMIT PREPARED 'x'`, "COMMIT"},
		{"RollbackPrepared", pg, `ROLLBACK PREPARED 'x'`, "ROLLBACK"},
		{"Set", pg, `SET synchronous_commit = off`, "SET"},
		{"SetLocal", pg, `SET LOCAL synchronous_commit = off`, "SET"},
		{"Reset", pg, `RESET ALL`, "RESET"},
		{"Discard", pg, `DISCARD ALL`, "DISCARD"},
		{"Listen", pg, `LISTEN x`, "LISTEN"},
		{"Unlisten", pg, `UNLISTEN *`, "UNLISTEN"},
		{"Deallocate", pg, `DEALLOCATE ALL`, "DEALLOCATE"},
		{"Notify", pg, `NOTIFY x`, ""},
		{"SetConfig", pg, `SELECT set_config('synchronous_commit', 'off', true)`, "set_config"},
		{"SetConfigQuoted", pg, `SELECT pg_catalog."set_config"('synchronous_commit', 'off', true)`, "set_config"},
		{"PgSettings", pg, `UPDATE pg_settings SET setting = 'off' WHERE name = 'synchronous_commit'`, "pg_settings"},
		{"ShowSetting", pg, `SHOW synchronous_commit`, ""},
		{"UpdateSet", both, `UPDATE t SET a = 1`, ""},

		{"PragmaWrite", sqlite, `PRAGMA synchronous = OFF`, "PRAGMA"},
		{"PragmaCall", sqlite, `PRAGMA synchronous(0)`, "PRAGMA"},
		{"PragmaRead", sqlite, `PRAGMA journal_mode`, "PRAGMA"},
		{"PragmaCheckpoint", sqlite, `PRAGMA wal_checkpoint(TRUNCATE)`, "PRAGMA"},
		{"PragmaSchema", sqlite, `PRAGMA main.synchronous = OFF`, "PRAGMA"},
		{"PragmaQuotedName", sqlite, `PRAGMA "synchronous" = OFF`, "PRAGMA"},
		{"PragmaBare", sqlite, `PRAGMA`, "PRAGMA"},
		{"PragmaTableInfo", sqlite, `PRAGMA table_info(charges)`, ""},
		{"PragmaTableInfoSchema", sqlite, `pragma MAIN.Table_Info('charges')`, ""},
		{"PragmaIndexList", sqlite, `PRAGMA index_list = charges`, ""},
		{"PragmaForeignKeyList", sqlite, `PRAGMA foreign_key_list("charges")`, ""},
		{"PragmaQuotedAllowed", sqlite, `PRAGMA [table_info](charges)`, ""},

		{"MultiStatement", both, `INSERT INTO t VALUES (1); COMMIT`, "COMMIT"},
		{"MultiStatementTrailing", both, `INSERT INTO t VALUES (1); COMMIT;`, "COMMIT"},
		{"MultiAllowed", both, `INSERT INTO t VALUES (1); INSERT INTO t VALUES (2);`, ""},
		{"BlockComment", both, `/* x */ COMMIT`, "COMMIT"},
		{"LineComment", both, "-- x\nCOMMIT", "COMMIT"},
		{"LineCommentCR", pg, "-- x\rCOMMIT", "COMMIT"},
		{"LineCommentCRSQLite", sqlite, "-- x\rCOMMIT", ""}, // SQLite's comment runs to \n
		{"LeadingSpace", both, " \t\r\n\f\vCOMMIT", "COMMIT"},
		{"LeadingSemicolons", both, ";;\n ; COMMIT", "COMMIT"},
		{"ByteOrderMark", both, "SELECT 1;\ufeffCOMMIT", "COMMIT"},
		{"CommentInside", both, `INSERT INTO t VALUES (1);/**/COMMIT`, "COMMIT"},
		{"CommentOnly", both, `/* COMMIT */`, ""},
		{"LineCommentOnly", both, `-- COMMIT`, ""},
		{"UnterminatedComment", both, `SELECT 1 /* ; COMMIT`, ""},
		{"StringHidesCommit", both, `INSERT INTO t VALUES ('a;COMMIT')`, ""},
		{"StringDoubledQuote", both, `INSERT INTO t VALUES ('it''s;COMMIT')`, ""},
		{"StringThenCommit", both, `INSERT INTO t VALUES ('a'';'); COMMIT`, "COMMIT"},
		{"QuotedIdentifier", both, `SELECT 1 AS "x;COMMIT"`, ""},
		{"BacktickIdentifier", sqlite, "SELECT 1 AS `x;COMMIT`", ""},
		{"BracketIdentifier", sqlite, `SELECT 1 AS [x;COMMIT]`, ""},
		{"BracketIsSubscriptOnPostgres", pg, `SELECT a[1]; COMMIT`, "COMMIT"},
		{"BacktickIsNotQuoteOnPostgres", pg, "SELECT 1 ` ; COMMIT ` ", "COMMIT"},
		{"CommitAsColumn", both, `SELECT commit FROM t`, ""},
		{"CommitWord", both, `SELECT 1 AS committed; SELECT 2`, ""},
		{"QuotedCommitIsIdentifier", both, `"COMMIT"`, ""},

		{"Trigger", sqlite, `CREATE TRIGGER tr AFTER INSERT ON t BEGIN UPDATE t SET a = 1; INSERT INTO u VALUES (1); END`, ""},
		{"TriggerWithCaseEnd", sqlite, `CREATE TEMP TRIGGER IF NOT EXISTS tr AFTER INSERT ON t BEGIN SELECT CASE WHEN 1 THEN 2 END; END;`, ""},
		{"TriggerThenCommit", sqlite, `CREATE TRIGGER tr AFTER INSERT ON t BEGIN SELECT 1; END; COMMIT`, "COMMIT"},
		{"ExplainTrigger", sqlite, `EXPLAIN CREATE TRIGGER tr AFTER INSERT ON t BEGIN SELECT 1; END; END`, "END"},
		{"NotATrigger", sqlite, `CREATE TABLE trigger (a); BEGIN`, "BEGIN"},
		{"SQLiteTclVariable", sqlite, `SELECT $a(';COMMIT)`, ""},
		{"SQLiteTclVariableQuote", sqlite, `SELECT $a(') ; COMMIT; --'`, "COMMIT"},
		{"SQLiteTclVariableColons", sqlite, `SELECT :a::b(x) ; COMMIT`, "COMMIT"},
		{"SQLiteAtVariable", sqlite, `SELECT @a; COMMIT`, "COMMIT"},

		{"DollarQuoted", pg, `DO $$ BEGIN PERFORM 1; COMMIT; END $$`, ""},
		{"DollarTag", pg, `CREATE FUNCTION f() RETURNS int AS $fn$ BEGIN RETURN 1; END; $fn$ LANGUAGE plpgsql`, ""},
		{"DollarTagNested", pg, `SELECT $a$ $$ ; COMMIT $$ $a$`, ""},
		{"DollarThenCommit", pg, `SELECT $$x$$; COMMIT`, "COMMIT"},
		{"DollarParam", pg, `SELECT $1; COMMIT`, "COMMIT"},
		{"DollarInIdentifier", pg, `SELECT a$$b; COMMIT; SELECT $$`, "COMMIT"},
		{"NestedComment", pg, `/* /* */ COMMIT */ SELECT 1`, ""},
		{"NestedCommentSQLite", sqlite, `/* /* */ COMMIT; */`, "COMMIT"},
		{"EString", pg, `SELECT E'\'; COMMIT; --'`, ""},
		{"EStringIsPlainOnSQLite", sqlite, `SELECT E'\'; COMMIT; --'`, "COMMIT"},
		{"Backslash", pg, `SELECT '\'; COMMIT; SELECT '\'`, "COMMIT"},
		// With standard_conforming_strings off this COMMIT runs; with it on
		// it is in a string. Refused either way.
		{"BackslashOff", pg, `SELECT 'a\'' ; COMMIT ; SELECT '\'`, "COMMIT"},
		{"BeginAtomic", pg, `CREATE FUNCTION f() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1; END`, "END"},
	}
	for _, tt := range tests {
		for _, d := range []schema.Dialect{schema.SQLite, schema.Postgres} {
			if tt.dialect != both && string(d) != tt.dialect {
				continue
			}
			t.Run(tt.name+"/"+string(d), func(t *testing.T) {
				err := checkStatements(d, tt.q)
				if tt.refused == "" {
					if err != nil {
						t.Fatalf("checkStatements(%q) = %v, want allowed", tt.q, err)
					}
					return
				}
				if !errors.Is(err, ErrStatementRefused) {
					t.Fatalf("checkStatements(%q) = %v, want refused", tt.q, err)
				}
				var re *refusedError
				if !errors.As(err, &re) || !strings.Contains(re.stmt, tt.refused) {
					t.Fatalf("checkStatements(%q) = %v, want the statement with %q named", tt.q, err, tt.refused)
				}
			})
		}
	}
}

func TestCheckStatements_Message(t *testing.T) {
	t.Parallel()
	err := checkStatements(schema.SQLite, "INSERT INTO t VALUES (1);\n  COMMIT")
	want := `outbox: statement "COMMIT" refused: it controls the transaction, which the layer owns`
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("got %v, want it to start with %q", err, want)
	}
	long := "SET application_name = '" + strings.Repeat("é", 50) + "'"
	err = checkStatements(schema.Postgres, long)
	var re *refusedError
	if !errors.As(err, &re) || len(re.stmt) > 64 || !strings.HasSuffix(re.stmt, "…") {
		t.Fatalf("got %v, want a short excerpt", err)
	}
}

// What the guard adds to each statement a handler runs.
func BenchmarkCheckStatements(b *testing.B) {
	for _, bc := range []struct{ name, q string }{
		{"Insert", `INSERT INTO charges (amount, currency, created_at) VALUES ($1, $2, $3) RETURNING id`},
		{"Select", `SELECT currency, count(*), sum(amount) FROM charges WHERE refunded_at IS NULL GROUP BY currency`},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				if err := checkStatements(schema.Postgres, bc.q); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
