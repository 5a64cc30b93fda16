package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/admin"
	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
	"github.com/mcp-outbox/mcp-outbox/internal/reencrypt"
	"github.com/mcp-outbox/mcp-outbox/internal/sealing"
	"github.com/mcp-outbox/mcp-outbox/outbox/seal"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// keyFileFlag adds --encryption-key-file to fs.
func keyFileFlag(env *environment, fs *flag.FlagSet, p *string) {
	fs.StringVar(p, "encryption-key-file", env.envDefault("MCP_OUTBOX_ENCRYPTION_KEY_FILE", ""),
		"encrypt recorded results, task arguments and effect bodies and headers with the keys in `FILE` "+
			"(ID:BASE64(32 bytes) a line; the first encrypts, all decrypt; mode 600); see 'Data protection' in the README [MCP_OUTBOX_ENCRYPTION_KEY_FILE]")
}

// loadKeys is the key ring of --encryption-key-file; nil when not given.
// The nil is the interface's own: a nil *seal.FileKeyRing in a KeyRing
// would read as encryption on.
func loadKeys(path string) (seal.KeyRing, error) {
	if path == "" {
		return nil, nil
	}
	ring, err := seal.LoadKeyFile(path)
	if err != nil {
		return nil, usagef("--encryption-key-file: %v", err)
	}
	return ring, nil
}

func runOutboxForget(ctx context.Context, env *environment, s outboxSub, args []string) error {
	fs, dbPath := subFlags(env, s)
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 || pos[0] == "" {
		return usagef("forget-principal: give one PRINCIPAL")
	}
	principal := pos[0]
	if !strings.HasPrefix(principal, "tenant:") { // a tenant's principal is given as stored
		principal = callkey.ParsePrincipal(principal)
	}
	db, err := openExisting(ctx, *dbPath)
	if err != nil {
		return err
	}
	defer db.Close()
	f, err := admin.ForgetPrincipal(ctx, db, principal, time.Now())
	if err != nil {
		return err
	}
	// The audit record: who ran it is the shell's business; what was
	// erased, and when, is here and in data_keys.erased_at.
	logger, err := newLogger(env.stderr, "info", "text")
	if err != nil {
		return err
	}
	logger.Warn("operator action", "action", "forget-principal", "principal", principal, "data_keys", f.DataKeys,
		"calls", f.Calls, "effects", f.Effects, "in_flight", f.InFlight, "db", schema.Redact(*dbPath))
	if f.Unknown {
		// An erasure script records exit 0 as done: a principal written
		// in another form than its calls' (a typo, a tenant's user without
		// the tenant) must not read as a request met.
		return errors.New("forget-principal: " + f.UnknownMessage())
	}
	fmt.Fprintf(env.stdout, "principal %s forgotten: %d data keys erased, %d calls and %d effects cleared\n",
		principal, f.DataKeys, f.Calls, f.Effects)
	if f.InFlight > 0 {
		fmt.Fprintf(env.stdout, "%d calls were in flight and are not erased: run forget-principal again once they ended\n", f.InFlight)
	}
	if f.WALPending {
		fmt.Fprintln(env.stdout, "the -wal file still holds pages from before the forget (a reader held an older snapshot): "+
			"run forget-principal again once readers are done to checkpoint it")
	}
	// Forgetting erases what was recorded, not who may call: a token of
	// the principal still works, and its next call is served and recorded
	// under a new data key.
	_, err = fmt.Fprintf(env.stdout, "revoke %s's tokens at the identity provider: a new call of theirs is served and recorded again\n", principal)
	return err
}

func runOutboxReencrypt(ctx context.Context, env *environment, s outboxSub, args []string) error {
	return runRewrite(ctx, env, s, args, reencrypt.Seal)
}

func runOutboxDecrypt(ctx context.Context, env *environment, s outboxSub, args []string) error {
	return runRewrite(ctx, env, s, args, reencrypt.Decrypt)
}

func runRewrite(ctx context.Context, env *environment, s outboxSub, args []string,
	rewrite func(context.Context, *schema.DB, *sealing.Sealer, *reencrypt.Options) (*reencrypt.Counts, error)) error {
	fs, dbPath := subFlags(env, s)
	var keyFile string
	keyFileFlag(env, fs, &keyFile)
	batch := fs.Int("batch", 500, "rows per transaction")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("%s: unexpected argument %q", s.name, pos[0])
	}
	if keyFile == "" {
		return usagef("%s: give --encryption-key-file (or MCP_OUTBOX_ENCRYPTION_KEY_FILE)", s.name)
	}
	keys, err := loadKeys(keyFile)
	if err != nil {
		return err
	}
	db, err := openExisting(ctx, *dbPath)
	if err != nil {
		return err
	}
	defer db.Close()
	if s.name == "reencrypt" {
		if err := checkRotation(ctx, db, keys); err != nil {
			return err
		}
	}
	r, err := rewrite(ctx, db, sealing.Of(keys), &reencrypt.Options{Batch: *batch, Progress: env.stderr})
	if r != nil {
		fmt.Fprintf(env.stdout, "%s: %d data keys rewrapped, %d calls and %d effects rewritten, %d values unreadable\n",
			s.name, r.DataKeys, r.Calls, r.Effects, r.Unreadable)
	}
	if err == nil && r.Unreadable > 0 {
		return fmt.Errorf("%s: %d values could not be decrypted (changed, or under a key missing from the key file); the data keys are kept", s.name, r.Unreadable)
	}
	return err
}

// checkRotation refuses a reencrypt whose key file has several keys while
// every data key is already under its first: most likely the new key was
// appended rather than put first, and a script that went on to remove the
// old key (the first) would leave every value unreadable. A hint and exit
// 0 let it go on. The same state follows a finished rotation run again
// with the old key still in the file; that refusal costs a rerun, the
// other a database, and the message covers both.
func checkRotation(ctx context.Context, db *schema.DB, keys seal.KeyRing) error {
	fr, ok := keys.(*seal.FileKeyRing)
	if !ok || len(fr.IDs()) < 2 {
		return nil
	}
	// Without a ring, MissingKeys lists every key id that wraps a live
	// data key.
	inUse, err := sealing.MissingKeys(ctx, db.Read, nil)
	if err != nil || len(inUse) == 0 {
		return err
	}
	for _, id := range inUse {
		if id != fr.Current() {
			return nil
		}
	}
	others := make([]string, 0, len(fr.IDs())-1)
	for _, id := range fr.IDs()[1:] {
		others = append(others, fmt.Sprintf("%q", id))
	}
	return usagef("reencrypt: every data key is already under %q, the key file's first key, and none under %s: nothing was changed. "+
		"If %s is the new key, it must be the key file's first line: put it first, restart every process on the database, and run reencrypt again "+
		"(removing %q now would leave every value unreadable). If the rotation to %q is already done, %s can leave the key file",
		fr.Current(), strings.Join(others, ", "), strings.Join(others, ", "), fr.Current(), fr.Current(), strings.Join(others, ", "))
}
