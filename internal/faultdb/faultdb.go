// Package faultdb is a database/sql driver for tests: modernc.org/sqlite
// ([New]) or pgx ([NewPostgres]) with faults. Every call the database/sql
// package makes of a connection (begin, exec, query, commit) passes an
// [Injector], which can fail it with the error the database itself returns
// (SQLite's for an I/O error, a locked database, a full disk or a
// read-only database, [Kinds]; PostgreSQL's for a connection failure, an
// administrator's shutdown, a full disk, a serialization failure or a lock
// timeout, [PgKinds]), at a set rate drawn from a seeded random source.
//
// Faults are chosen by what is hit: the statement's text, or for a commit
// the statements its transaction ran. So a test can fail one operation of
// the code under test (a claim, a handler's insert, the commit that holds
// an outcome) and leave the rest alone, and say how often.
//
// The errors are not imitations: [Err] returns an error SQLite returned when
// the condition was produced for real, once per process (see errors.go), so
// code that classifies errors by type, code or message sees exactly what it
// would see in production.
//
// What a fault does to the database is modelled on what SQLite does:
//
//   - a failed statement changed nothing (SQLite rolls back the statement);
//     with [Rule.Rollback] it also ends the whole transaction, as SQLite may
//     after an I/O error or a full disk, so that later statements of the
//     transaction's owner run outside any transaction and its COMMIT fails;
//   - a failed BEGIN began nothing;
//   - a failed COMMIT rolled the transaction back: nothing of it persists.
//
// On PostgreSQL the server itself fails the call: the wrapper sends, in
// place of the picked statement, one that raises the kind's SQLSTATE, so
// the error is the server's *pgconn.PgError and the server does what it
// does after a failed statement:
//
//   - outside a transaction, the statement changed nothing;
//   - in a transaction, the whole transaction is aborted: every later
//     statement fails with 25P02 (in_failed_sql_transaction) until ROLLBACK
//     TO a savepoint taken before the fault, or ROLLBACK, and a COMMIT
//     rolls back ([Rule.Rollback] adds nothing);
//   - a failed BEGIN began nothing; a failed COMMIT rolled back.
//
// The package is for tests only; nothing outside _test.go files imports it.
package faultdb

import (
	"database/sql"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"

	"modernc.org/sqlite"
)

// Op is a kind of driver call a rule can fail.
type Op int

// Ops, combined with |.
const (
	Begin  Op = 1 << iota // BEGIN of a transaction
	Exec                  // a statement run for its effect
	Query                 // a statement run for its rows
	Commit                // COMMIT of a transaction

	Stmt = Exec | Query // every statement
)

// Rule says which calls fail, how and how often.
type Rule struct {
	// Name identifies the rule in [Injector.Faults] and [Injector.Seen].
	Name string
	// Op is what the rule can fail; zero means Stmt.
	Op Op
	// Stmt picks statements (Exec, Query) by their text; nil picks all.
	Stmt func(query string) bool
	// Tx picks commits by the statements their transaction ran, in order;
	// nil picks all.
	Tx func(stmts []string) bool
	// Kind is the error returned.
	Kind Kind
	// Rate is the probability that a picked call fails, from 0 to 1.
	Rate float64
	// Max, if not zero, bounds the faults the rule injects.
	Max int
	// Rollback makes a failed statement also roll back the transaction it
	// ran in (see the package doc). SQLite only.
	Rollback bool
}

// Contains returns a Stmt matcher for statements containing any of subs.
func Contains(subs ...string) func(string) bool {
	return func(q string) bool {
		for _, s := range subs {
			if strings.Contains(q, s) {
				return true
			}
		}
		return false
	}
}

// Ran returns a Tx matcher for transactions that ran a statement
// containing any of subs.
func Ran(subs ...string) func([]string) bool {
	match := Contains(subs...)
	return func(stmts []string) bool {
		for _, q := range stmts {
			if match(q) {
				return true
			}
		}
		return false
	}
}

// Injector decides which calls fail. Its methods are safe for concurrent
// use. A new injector injects nothing until [Injector.Set] gives it rules.
type Injector struct {
	name string
	seed uint64

	mu     sync.Mutex
	rules  []*ruleState
	counts map[string]*counts
}

type ruleState struct {
	Rule
	rng *rand.Rand
}

type counts struct{ seen, faults int }

var drivers atomic.Int64

// New returns an injector whose random choices follow seed, and registers
// a driver for it under a name of its own ([Injector.DriverName]):
// database/sql keeps drivers for the life of the process, so each
// injector gets a name instead of sharing one global switch between
// parallel tests.
func New(seed uint64) *Injector {
	in := &Injector{name: fmt.Sprintf("sqlite-faults-%d", drivers.Add(1)), seed: seed, counts: map[string]*counts{}}
	// A fresh modernc driver: the same code the "sqlite" name runs.
	sql.Register(in.name, &drv{base: &sqlite.Driver{}, inj: in})
	return in
}

// DriverName is the name to pass to sql.Open (or schema.Options.Driver).
func (in *Injector) DriverName() string { return in.name }

// Set replaces the rules; with none, nothing fails. Each rule draws from a
// random source of its own, seeded from the injector's seed and the rule's
// position, so that adding a rule does not change another's choices.
// Counts are kept across Set.
func (in *Injector) Set(rules ...Rule) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.rules = nil
	for i, r := range rules {
		if r.Op == 0 {
			r.Op = Stmt
		}
		if r.Name == "" {
			r.Name = fmt.Sprintf("rule%d", i)
		}
		if in.counts[r.Name] == nil {
			in.counts[r.Name] = &counts{}
		}
		in.rules = append(in.rules, &ruleState{Rule: r, rng: rand.New(rand.NewPCG(in.seed, uint64(i)+1))})
	}
}

// Faults is how many faults the named rule has injected.
func (in *Injector) Faults(name string) int {
	in.mu.Lock()
	defer in.mu.Unlock()
	if c := in.counts[name]; c != nil {
		return c.faults
	}
	return 0
}

// Seen is how many calls the named rule picked, failed or not.
func (in *Injector) Seen(name string) int {
	in.mu.Lock()
	defer in.mu.Unlock()
	if c := in.counts[name]; c != nil {
		return c.seen
	}
	return 0
}

// decide returns the rule that fails this call, or nil. For statements,
// query is the text; for commits, stmts are the transaction's statements.
func (in *Injector) decide(op Op, query string, stmts []string) *ruleState {
	in.mu.Lock()
	defer in.mu.Unlock()
	for _, r := range in.rules {
		if r.Op&op == 0 {
			continue
		}
		if op&Stmt != 0 && r.Stmt != nil && !r.Stmt(query) {
			continue
		}
		if op == Commit && r.Tx != nil && !r.Tx(stmts) {
			continue
		}
		c := in.counts[r.Name]
		c.seen++
		if r.Max > 0 && c.faults >= r.Max {
			continue
		}
		if r.rng.Float64() < r.Rate {
			c.faults++
			return r
		}
	}
	return nil
}
