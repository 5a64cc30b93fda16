// Package reencrypt rewrites the sealed values of an outbox database:
// under the key file's current key (mcp-outbox encryption reencrypt), or
// back to plaintext (mcp-outbox encryption decrypt).
package reencrypt

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/mcp-outbox/mcp-outbox/internal/sealing"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// Options configure [Seal] and [Decrypt]; nil means the
// defaults.
type Options struct {
	// Batch is how many rows one transaction rewrites; zero means 500.
	Batch int
	// Progress, if not nil, receives a line per batch.
	Progress io.Writer
}

// Counts counts what Seal or Decrypt rewrote.
type Counts struct {
	DataKeys int `json:"dataKeys"` // data keys rewrapped under the current key
	Calls    int `json:"calls"`    // calls whose result or task arguments were rewritten
	Effects  int `json:"effects"`  // effects whose body and headers were rewritten
	// Unreadable values were left as they are: changed, or under a key
	// missing from the key file (Decrypt only).
	Unreadable int `json:"unreadable"`
}

// Seal brings a database under s's current key:
//
//   - it rewraps every data key that another key wraps under the current
//     one (the values themselves are sealed under the data keys and do not
//     change), after which the other keys can leave the key file;
//   - it seals the plaintext values of a database that was used without
//     encryption (and those a cooperating upstream of mcp-outbox proxy
//     wrote itself), dropping recorded destination responses, which may
//     echo an effect's body.
//
// It works in batches, each its own transaction, while serve runs; every
// write is a compare-and-set on the value it read, so it never undoes a
// concurrent write. Interrupted, it is run again: what is done is not done
// twice.
func Seal(ctx context.Context, db *schema.DB, s *sealing.Sealer, opts *Options) (*Counts, error) {
	if s == nil {
		return nil, errors.New("reencrypt: no key file")
	}
	o := defaults(opts)
	r := &Counts{}
	for {
		n, err := s.Rewrap(ctx, db.Write, o.Batch)
		if err != nil {
			return r, fmt.Errorf("rewrap data keys: %w", err)
		}
		if n == 0 {
			break
		}
		r.DataKeys += n
		o.progress("data keys rewrapped under %q: %d", s.Ring().Current(), r.DataKeys)
	}
	convert := func(v []byte) ([]byte, bool) { return v, v != nil && !sealing.IsSealed(v) }
	err := rewriteValues(ctx, db, o, r, convert, func(ctx context.Context, q sealing.Querier, ref sealing.Ref, v []byte) ([]byte, error) {
		return s.Seal(ctx, q, ref, v)
	})
	return r, err
}

// Decrypt turns encryption off, explicitly: it opens every sealed value
// and writes it back in plaintext, then deletes the data keys, after which
// serve runs without a key file. Stop every serve that has the key file
// first: a value one seals meanwhile makes Decrypt fail, and it is run
// again. Values that cannot be opened (changed, a key missing) are left
// and counted, and the data keys are kept. Hashes keyed under encryption
// stay: their calls match on their key alone until they expire.
func Decrypt(ctx context.Context, db *schema.DB, s *sealing.Sealer, opts *Options) (*Counts, error) {
	if s == nil {
		return nil, errors.New("decrypt: no key file")
	}
	o := defaults(opts)
	r := &Counts{}
	sealed := func(v []byte) ([]byte, bool) { return v, sealing.IsSealed(v) }
	err := rewriteValues(ctx, db, o, r, sealed, func(ctx context.Context, q sealing.Querier, ref sealing.Ref, v []byte) ([]byte, error) {
		p, err := s.Open(ctx, q, ref, v)
		if err != nil && !errors.Is(err, sealing.ErrErased) {
			return nil, errUnreadable{err}
		}
		return p, err
	})
	if err != nil || r.Unreadable > 0 {
		return r, err
	}
	tx, err := db.Write.BeginTx(ctx, nil)
	if err != nil {
		return r, err
	}
	defer tx.Rollback()
	var left int
	if err := tx.QueryRowContext(ctx, `
SELECT (SELECT count(*) FROM calls WHERE result LIKE 'mcpo1:%' OR task_params LIKE 'mcpo1:%')
     + (SELECT count(*) FROM effects WHERE headers LIKE 'mcpo1:%')`).Scan(&left); err != nil {
		return r, err
	}
	if left > 0 {
		return r, fmt.Errorf("decrypt: %d values were sealed meanwhile: stop every serve with the key file and run decrypt again", left)
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM data_keys WHERE erased_at IS NULL`); err != nil {
		return r, err
	}
	o.progress("data keys deleted: encryption is off")
	return r, tx.Commit()
}

type errUnreadable struct{ error }

func defaults(opts *Options) Options {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Batch <= 0 {
		o.Batch = 500
	}
	return o
}

func (o Options) progress(format string, args ...any) {
	if o.Progress != nil {
		fmt.Fprintf(o.Progress, format+"\n", args...)
	}
}

// A value's rewrite: pick says whether v needs one, rewrite makes it.
type (
	pickFunc    func(v []byte) ([]byte, bool)
	rewriteFunc func(ctx context.Context, q sealing.Querier, ref sealing.Ref, v []byte) ([]byte, error)
)

const (
	selectCallValues = `
SELECT id, principal, result, task_params FROM calls WHERE id > $1 ORDER BY id LIMIT $2`
	updateCallValues = `
UPDATE calls SET result = $1, task_params = $2
WHERE id = $3 AND coalesce(result, '') = $4 AND coalesce(task_params, '') = $5`
	// Not the effects of a forgotten principal's calls: ForgetPrincipal
	// left them an empty plaintext header set ('{}'), which sealing would
	// give the principal a live data key again, and nothing to protect.
	selectEffectValues = `
SELECT e.id, e.idempotency_key, coalesce(c.principal, ''), e.headers, e.body
FROM effects e LEFT JOIN calls c ON c.id = e.call_id WHERE e.id > $1 AND c.erased_at IS NULL ORDER BY e.id LIMIT $2`
	updateEffectValues = `
UPDATE effects SET headers = $1, body = $2, response = NULL WHERE id = $3 AND headers = $4`
)

// rewriteValues walks calls, then effects, by id, a batch at a time.
func rewriteValues(ctx context.Context, db *schema.DB, o Options, r *Counts, pick pickFunc, rewrite rewriteFunc) error {
	type row struct {
		id               int64
		key, principal   string
		a, b             []byte // result and task_params; headers and body
		aNull, bNull     bool
		newA, newB       []byte
		changeA, changeB bool
	}
	for _, table := range []string{"calls", "effects"} {
		for cursor := int64(0); ; {
			q, up := selectCallValues, updateCallValues
			if table == "effects" {
				q, up = selectEffectValues, updateEffectValues
			}
			rows, err := db.Read.QueryContext(ctx, q, cursor, o.Batch)
			if err != nil {
				return fmt.Errorf("read %s: %w", table, err)
			}
			var batch []*row
			for rows.Next() {
				x := &row{}
				var a, b sql.NullString
				var body []byte
				if table == "calls" {
					err = rows.Scan(&x.id, &x.principal, &a, &b)
					x.a, x.aNull, x.b, x.bNull = []byte(a.String), !a.Valid, []byte(b.String), !b.Valid
				} else {
					err = rows.Scan(&x.id, &x.key, &x.principal, &a, &body)
					x.a, x.b, x.bNull = []byte(a.String), body, body == nil
				}
				if err != nil {
					rows.Close()
					return fmt.Errorf("read %s: %w", table, err)
				}
				batch = append(batch, x)
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return fmt.Errorf("read %s: %w", table, err)
			}
			if len(batch) == 0 {
				break
			}
			cursor = batch[len(batch)-1].id
			tx, err := db.Write.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			changed := 0
			for _, x := range batch {
				cols := [2]string{"result", "task_params"}
				rowRef := fmt.Sprint(x.id)
				if table == "effects" {
					cols, rowRef = [2]string{"headers", "body"}, x.key
				}
				var bad bool
				for i, v := range [][]byte{x.a, x.b} {
					if (i == 0 && x.aNull) || (i == 1 && x.bNull) {
						continue
					}
					if _, ok := pick(v); !ok {
						continue
					}
					nv, err := rewrite(ctx, tx, sealing.Ref{Row: rowRef, Column: cols[i], Principal: x.principal}, v)
					if err != nil {
						var u errUnreadable
						if errors.As(err, &u) {
							bad = true
							continue
						}
						if !errors.Is(err, sealing.ErrErased) {
							tx.Rollback()
							return fmt.Errorf("%s %d: %w", table, x.id, err)
						}
						nv = nil // erased: nothing to keep
					}
					if i == 0 {
						x.newA, x.changeA = nv, true
					} else {
						x.newB, x.changeB = nv, true
					}
				}
				if bad {
					r.Unreadable++
				}
				if !x.changeA && !x.changeB {
					continue
				}
				if !x.changeA {
					x.newA = x.a
				}
				if !x.changeB {
					x.newB = x.b
				}
				var res sql.Result
				if table == "calls" {
					res, err = tx.ExecContext(ctx, up, nullable(x.newA, x.aNull && !x.changeA), nullable(x.newB, x.bNull && !x.changeB),
						x.id, string(x.a), string(x.b))
				} else {
					headers := string(x.newA)
					if headers == "" {
						headers = "{}"
					}
					var body any
					if !(x.bNull && !x.changeB) && x.newB != nil {
						body = x.newB
					}
					res, err = tx.ExecContext(ctx, up, headers, body, x.id, string(x.a))
				}
				if err != nil {
					tx.Rollback()
					return fmt.Errorf("rewrite %s %d: %w", table, x.id, err)
				}
				if n, _ := res.RowsAffected(); n == 1 {
					changed++
				}
			}
			if err := tx.Commit(); err != nil {
				return fmt.Errorf("rewrite %s: %w", table, err)
			}
			if table == "calls" {
				r.Calls += changed
			} else {
				r.Effects += changed
			}
			o.progress("%s: up to id %d, %d rewritten", table, cursor, map[string]int{"calls": r.Calls, "effects": r.Effects}[table])
		}
	}
	return nil
}

// nullable is v as a text column, NULL when null or v is nil.
func nullable(v []byte, null bool) any {
	if null || v == nil {
		return nil
	}
	return strings.Clone(string(v))
}
