package faultdb

import (
	"database/sql"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"modernc.org/sqlite"
	"modernc.org/sqlite/vfs"
)

// Kind is the error a fault returns.
type Kind int

// Kinds of faults, each SQLite's own error for the condition.
const (
	// IOErr is SQLITE_IOERR: the file could not be read or written.
	// "disk I/O error (10)". A failed write or fsync may carry an extended
	// code instead (778, 1034), with the same primary code and text.
	IOErr Kind = iota + 1
	// Busy is SQLITE_BUSY: another connection held the lock past
	// busy_timeout. "database is locked (5) (SQLITE_BUSY)".
	Busy
	// Full is SQLITE_FULL: no room to grow the file (a full disk, or
	// max_page_count). "database or disk is full (13)".
	Full
	// ReadOnly is SQLITE_READONLY: the database cannot be written (a
	// read-only file, PRAGMA query_only). "attempt to write a readonly
	// database (8)".
	ReadOnly
)

// Kinds are all SQLite kinds, for tests that try each.
var Kinds = []Kind{IOErr, Busy, Full, ReadOnly}

func (k Kind) String() string {
	switch k {
	case IOErr:
		return "ioerr"
	case Busy:
		return "busy"
	case Full:
		return "full"
	case ReadOnly:
		return "readonly"
	}
	if p, ok := pgKinds[k]; ok {
		return p.name
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

var samples struct {
	once sync.Once
	errs map[Kind]error
	err  error
}

// Err returns SQLite's own error for k: a *sqlite.Error that modernc's
// driver returned when this process produced the condition for real, in a
// scratch directory, the first time any error was asked for. modernc's
// Error has no exported constructor, and an imitation would differ in
// something (the type, the code, the text) that classification might
// depend on; a real one cannot. The same value is returned every time:
// *sqlite.Error is immutable.
//
// Err panics if the conditions cannot be produced: the tests that use it
// would test nothing.
//
// For a PostgreSQL kind, Err returns a *pgconn.PgError with the kind's
// SQLSTATE, severity and text: what the server sends, and what a fault
// on a connection returns (produced by the server, see raise).
func Err(k Kind) error {
	if _, ok := pgKinds[k]; ok {
		return pgErr(k)
	}
	samples.once.Do(func() { samples.errs, samples.err = produce() })
	if samples.err != nil {
		panic(fmt.Sprintf("faultdb: produce SQLite errors: %v", samples.err))
	}
	if e := samples.errs[k]; e != nil {
		return e
	}
	return errNoKind
}

func produce() (map[Kind]error, error) {
	dir, err := os.MkdirTemp("", "faultdb-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	out := map[Kind]error{}
	for k, f := range map[Kind]func(string) error{IOErr: ioErr, Busy: busy, Full: full, ReadOnly: readOnly} {
		err := f(dir)
		var se *sqlite.Error
		if !errors.As(err, &se) {
			return nil, fmt.Errorf("%s: got %T %v, want a *sqlite.Error", k, err, err)
		}
		out[k] = se
	}
	return out, nil
}

// open opens a scratch database of its own in dir with the real driver.
func open(dir, name, params string) (*sql.DB, error) {
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, name)+"?_pragma=busy_timeout(0)"+params)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1)
	return db, nil
}

// busy: a second connection wants the write lock the first one holds.
func busy(dir string) error {
	a, err := open(dir, "busy.db", "&_txlock=immediate")
	if err != nil {
		return err
	}
	defer a.Close()
	if _, err := a.Exec(`PRAGMA journal_mode=WAL`); err != nil {
		return err
	}
	tx, err := a.Begin()
	if err != nil {
		return err
	}
	defer tx.Rollback()
	b, err := open(dir, "busy.db", "&_txlock=immediate")
	if err != nil {
		return err
	}
	defer b.Close()
	_, err = b.Begin()
	return err
}

// full: an insert needs more pages than max_page_count allows.
func full(dir string) error {
	db, err := open(dir, "full.db", "")
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := db.Exec(`CREATE TABLE t (x)`); err != nil {
		return err
	}
	if _, err := db.Exec(`PRAGMA max_page_count = 2`); err != nil {
		return err
	}
	_, err = db.Exec(`INSERT INTO t VALUES (zeroblob(100000))`)
	return err
}

// readOnly: a write on a connection with query_only.
func readOnly(dir string) error {
	db, err := open(dir, "ro.db", "")
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := db.Exec(`CREATE TABLE t (x)`); err != nil {
		return err
	}
	if _, err := db.Exec(`PRAGMA query_only = 1`); err != nil {
		return err
	}
	_, err = db.Exec(`INSERT INTO t VALUES (1)`)
	return err
}

// ioErr: SQLite reads a database through a file system (modernc's fs.FS
// VFS) whose reads fail, as a failing disk's do.
func ioErr(string) error {
	name, fsys, err := vfs.New(failingFS{})
	if err != nil {
		return err
	}
	defer fsys.Close()
	db, err := sql.Open("sqlite", "file:bad.db?vfs="+name)
	if err != nil {
		return err
	}
	defer db.Close()
	var n int
	return db.QueryRow(`SELECT count(*) FROM sqlite_schema`).Scan(&n)
}

// failingFS holds one file, bad.db, of two pages, whose every read fails.
type failingFS struct{}

func (failingFS) Open(name string) (fs.File, error) {
	if name != "bad.db" {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	}
	return &failingFile{}, nil
}

type failingFile struct{ off int64 }

func (f *failingFile) Stat() (fs.FileInfo, error) { return failingInfo{}, nil }
func (f *failingFile) Read([]byte) (int, error)   { return 0, errors.New("input/output error") }
func (f *failingFile) Close() error               { return nil }

func (f *failingFile) Seek(off int64, whence int) (int64, error) {
	if whence != io.SeekStart {
		return 0, errors.New("seek: only from the start")
	}
	f.off = off
	return off, nil
}

type failingInfo struct{}

func (failingInfo) Name() string       { return "bad.db" }
func (failingInfo) Size() int64        { return 8192 }
func (failingInfo) Mode() fs.FileMode  { return 0o444 }
func (failingInfo) ModTime() time.Time { return time.Time{} }
func (failingInfo) IsDir() bool        { return false }
func (failingInfo) Sys() any           { return nil }
