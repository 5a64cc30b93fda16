// Package sealing is the layer's side of encryption at rest: the Sealer
// that seals and opens values under per-principal data keys stored in
// data_keys, wrapped by a key ring (package outbox/seal, which documents
// the scheme). A user gives the layer a key ring; the layer, its
// dispatcher, the operator surface and package query share one Sealer per
// ring ([Of]).
package sealing

import (
	"context"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/gcm"
	"github.com/mcp-outbox/mcp-outbox/outbox/seal"
)

// Prefix starts every sealed value; what follows is 'DEKID:BASE64'. No
// JSON value (a result, task arguments, headers) starts with it; an effect
// body that does is read as sealed, so bodies that begin with 'mcpo1:'
// must not be enqueued before encryption is turned on.
const Prefix = "mcpo1:"

var (
	// ErrTampered: a sealed value fails to open under its data key: it was
	// changed, or copied from another row, column or principal.
	ErrTampered = gcm.ErrTampered
	// ErrErased: the value's principal was forgotten; its data key is gone.
	ErrErased = errors.New("erased: the principal was forgotten, and its data key with it")
	// ErrNoKeyRing: a sealed value was read without a key file.
	ErrNoKeyRing = errors.New("the value is encrypted, and no key file was given (--encryption-key-file, MCP_OUTBOX_ENCRYPTION_KEY_FILE)")
)

// Querier runs statements: a *sql.DB, a *sql.Tx or a *sql.Conn.
type Querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Ref names where a value is stored: its row (a call's id, an effect's
// Idempotency-Key) and column, and whose it is.
type Ref struct {
	Row       string
	Column    string
	Principal string
}

func (r Ref) ad() []byte {
	return []byte("mcp-outbox value\x00" + r.Column + "\x00" + r.Row + "\x00" + r.Principal)
}

// IsSealed reports whether v is a sealed value; anything else is a
// plaintext row written before encryption was on (or with it off).
func IsSealed(v []byte) bool { return len(v) > len(Prefix) && string(v[:len(Prefix)]) == Prefix }

// DataKeyOf returns the id of the data key of a sealed value.
func DataKeyOf(v []byte) string {
	if !IsSealed(v) {
		return ""
	}
	id, _, _ := strings.Cut(string(v[len(Prefix):]), ":")
	return id
}

// A Sealer seals and opens values with data keys stored in data_keys. A
// nil *Sealer is encryption off: Seal returns the plaintext, Open returns
// plaintext rows and refuses sealed ones with ErrNoKeyRing.
type Sealer struct {
	ring seal.KeyRing
	now  func() time.Time

	mu    sync.Mutex
	deks  map[string]cachedDEK // by DEK id
	hashK []byte
}

type cachedDEK struct {
	keyID   string
	wrapped string
	aead    cipher.AEAD
}

// New returns a Sealer whose data keys ring wraps.
func New(ring seal.KeyRing) *Sealer {
	return &Sealer{ring: ring, now: time.Now, deks: map[string]cachedDEK{}}
}

// Ring is the Sealer's key ring.
func (s *Sealer) Ring() seal.KeyRing {
	if s == nil {
		return nil
	}
	return s.ring
}

const (
	selectLiveDEK = `SELECT id, key_id, wrapped FROM data_keys WHERE principal = $1 AND purpose = $2 AND erased_at IS NULL
ORDER BY created_at DESC, id`
	selectDEK = `SELECT principal, purpose, key_id, wrapped, erased_at FROM data_keys WHERE id = $1`
	insertDEK = `INSERT INTO data_keys (id, principal, purpose, key_id, wrapped, created_at) VALUES ($1, $2, $3, $4, $5, $6)`
)

// Purposes of data keys.
const (
	purposeSeal = "seal"
	purposeHash = "hash"
)

func dekAD(id, principal, purpose string) []byte {
	return []byte("mcp-outbox data key\x00" + id + "\x00" + principal + "\x00" + purpose)
}

// Seal encrypts plain for ref under ref.Principal's data key, creating the
// key on first use in q (so in the caller's transaction).
func (s *Sealer) Seal(ctx context.Context, q Querier, ref Ref, plain []byte) ([]byte, error) {
	if s == nil {
		return plain, nil
	}
	k, err := s.Key(ctx, q, ref.Principal)
	if err != nil {
		return nil, err
	}
	return k.Seal(ref, plain)
}

// A DataKey is a principal's live data key as one transaction found it:
// a caller that seals several values in one transaction (a call's result
// and its effects) looks the key up once. It must not outlive the
// transaction: an erase commits in between.
type DataKey struct {
	id, principal string
	aead          cipher.AEAD
}

// Principal is whose key it is.
func (k *DataKey) Principal() string { return k.principal }

// Key finds (or creates) principal's live data key in q.
func (s *Sealer) Key(ctx context.Context, q Querier, principal string) (*DataKey, error) {
	id, aead, err := s.liveKey(ctx, q, principal, purposeSeal)
	if err != nil {
		return nil, err
	}
	return &DataKey{id: id, principal: principal, aead: aead}, nil
}

// Seal encrypts plain for ref, whose Principal must be the key's.
func (k *DataKey) Seal(ref Ref, plain []byte) ([]byte, error) {
	if ref.Principal != k.principal {
		return nil, fmt.Errorf("seal: data key of %q used for a value of %q", k.principal, ref.Principal)
	}
	id := k.id
	ct, err := gcm.Seal(k.aead, plain, ref.ad())
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(Prefix)+len(id)+1+base64.RawStdEncoding.EncodedLen(len(ct)))
	out = append(out, Prefix...)
	out = append(out, id...)
	out = append(out, ':')
	return base64.RawStdEncoding.AppendEncode(out, ct), nil
}

// SealString is Seal for a text column.
func (s *Sealer) SealString(ctx context.Context, q Querier, ref Ref, plain string) (string, error) {
	v, err := s.Seal(ctx, q, ref, []byte(plain))
	return string(v), err
}

// Open decrypts v stored at ref. A plaintext v (a row from before
// encryption) is returned as it is. ref.Principal may be "" when the
// reader does not know the row's principal: the data key's then counts.
func (s *Sealer) Open(ctx context.Context, q Querier, ref Ref, v []byte) ([]byte, error) {
	if !IsSealed(v) {
		return v, nil
	}
	dekID, b64, _ := strings.Cut(string(v[len(Prefix):]), ":")
	if s == nil {
		return nil, fmt.Errorf("data key %s: %w", dekID, ErrNoKeyRing)
	}
	principal, aead, err := s.keyByID(ctx, q, dekID)
	if err != nil {
		return nil, err
	}
	return openWith(aead, principal, ref, b64)
}

// A Batch opens the values of one short read (a dispatcher's claim of
// effects) looking each data key up once. It must not outlive that read:
// an erase commits in between.
type Batch struct {
	s    *Sealer
	keys map[string]batchKey
}

type batchKey struct {
	principal string
	aead      cipher.AEAD
	err       error
}

// Batch starts a Batch.
func (s *Sealer) Batch() *Batch { return &Batch{s: s} }

// Open is Sealer.Open with the batch's data keys.
func (b *Batch) Open(ctx context.Context, q Querier, ref Ref, v []byte) ([]byte, error) {
	if !IsSealed(v) {
		return v, nil
	}
	dekID, b64, _ := strings.Cut(string(v[len(Prefix):]), ":")
	if b.s == nil {
		return nil, fmt.Errorf("data key %s: %w", dekID, ErrNoKeyRing)
	}
	k, ok := b.keys[dekID]
	if !ok {
		k.principal, k.aead, k.err = b.s.keyByID(ctx, q, dekID)
		if b.keys == nil {
			b.keys = map[string]batchKey{}
		}
		b.keys[dekID] = k
	}
	if k.err != nil {
		return nil, k.err
	}
	return openWith(k.aead, k.principal, ref, b64)
}

func openWith(aead cipher.AEAD, principal string, ref Ref, b64 string) ([]byte, error) {
	if ref.Principal != "" && ref.Principal != principal {
		return nil, ErrTampered
	}
	ref.Principal = principal
	ct, err := base64.RawStdEncoding.DecodeString(b64)
	if err != nil {
		return nil, ErrTampered
	}
	return gcm.Open(aead, ct, ref.ad())
}

// OpenString is Open for a text column.
func (s *Sealer) OpenString(ctx context.Context, q Querier, ref Ref, v string) (string, error) {
	p, err := s.Open(ctx, q, ref, []byte(v))
	return string(p), err
}

// liveKey is the principal's newest live data key that the ring can
// unwrap, created when there is none: a data key under a key the key file
// lacks is left for when the key is back, and the principal's new values
// go under a new one.
func (s *Sealer) liveKey(ctx context.Context, q Querier, principal, purpose string) (string, cipher.AEAD, error) {
	for range 2 {
		id, aead, err := s.findLive(ctx, q, principal, purpose)
		if err != nil || aead != nil {
			return id, aead, err
		}
		if err := s.create(ctx, q, principal, purpose); err != nil {
			return "", nil, err
		}
	}
	return "", nil, errors.New("data key: created, then not found")
}

func (s *Sealer) findLive(ctx context.Context, q Querier, principal, purpose string) (string, cipher.AEAD, error) {
	type dk struct {
		id, keyID string
		wrapped   []byte
	}
	var live []dk
	rows, err := q.QueryContext(ctx, selectLiveDEK, principal, purpose)
	if err != nil {
		return "", nil, fmt.Errorf("read data key: %w", err)
	}
	for rows.Next() {
		var d dk
		if err := rows.Scan(&d.id, &d.keyID, &d.wrapped); err != nil {
			rows.Close()
			return "", nil, fmt.Errorf("read data key: %w", err)
		}
		live = append(live, d)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return "", nil, fmt.Errorf("read data key: %w", err)
	}
	var missing error
	for _, d := range live {
		if !s.ring.Has(d.keyID) {
			missing = &seal.MissingKeyError{KeyID: d.keyID}
			continue
		}
		aead, err := s.unwrap(ctx, d.id, principal, purpose, d.keyID, d.wrapped)
		return d.id, aead, err
	}
	if missing != nil && purpose == purposeHash {
		// A new hash key would change every hash, and no retry would
		// match its first call: fail (see LoadHashKey).
		return "", nil, missing
	}
	return "", nil, nil
}

func (s *Sealer) create(ctx context.Context, q Querier, principal, purpose string) error {
	dek := make([]byte, seal.KeySize)
	idb := make([]byte, 12)
	if _, err := rand.Read(dek); err != nil {
		return err
	}
	if _, err := rand.Read(idb); err != nil {
		return err
	}
	id := "dk_" + hex.EncodeToString(idb)
	keyID := s.ring.Current()
	wrapped, err := s.ring.Wrap(ctx, keyID, dek, dekAD(id, principal, purpose))
	if err != nil {
		return fmt.Errorf("wrap data key: %w", err)
	}
	// Another process may create a key for the principal at the same
	// time: both are live, values name the one they are under, and Forget
	// erases both.
	if _, err := q.ExecContext(ctx, insertDEK, id, principal, purpose, keyID, wrapped, s.now().UnixMilli()); err != nil {
		return fmt.Errorf("store data key: %w", err)
	}
	return nil
}

// keyByID reads a data key's row every time, even when its unwrapped key
// is cached: an erase in another process (or replica) must hold at once.
func (s *Sealer) keyByID(ctx context.Context, q Querier, id string) (string, cipher.AEAD, error) {
	var principal, purpose, keyID string
	var wrapped []byte
	var erased sql.NullInt64
	err := q.QueryRowContext(ctx, selectDEK, id).Scan(&principal, &purpose, &keyID, &wrapped, &erased)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil, fmt.Errorf("data key %s: not in data_keys: %w", id, ErrTampered)
	}
	if err != nil {
		return "", nil, fmt.Errorf("read data key %s: %w", id, err)
	}
	if erased.Valid || wrapped == nil {
		return principal, nil, ErrErased
	}
	aead, err := s.unwrap(ctx, id, principal, purpose, keyID, wrapped)
	return principal, aead, err
}

func (s *Sealer) unwrap(ctx context.Context, id, principal, purpose, keyID string, wrapped []byte) (cipher.AEAD, error) {
	s.mu.Lock()
	c, ok := s.deks[id]
	s.mu.Unlock()
	if ok && c.keyID == keyID && c.wrapped == string(wrapped) {
		return c.aead, nil
	}
	dek, err := s.ring.Unwrap(ctx, keyID, wrapped, dekAD(id, principal, purpose))
	if err != nil {
		if errors.Is(err, ErrTampered) {
			// The likely cause is not a changed row but a key file
			// whose key under this id is another one: a key made anew
			// under an old id.
			return nil, fmt.Errorf("data key %s does not open under key %q: the key file's %q is not the key that wrapped it "+
				"(a new key given an old id? keys are rotated under a new id; put the old one back), or the row was changed: %w",
				id, keyID, keyID, err)
		}
		return nil, err
	}
	aead, err := gcm.New(dek)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.deks[id] = cachedDEK{keyID: keyID, wrapped: string(wrapped), aead: aead}
	s.mu.Unlock()
	return aead, nil
}

// HashPrefix starts a keyed args_hash; a plain SHA-256 is bare hex.
const HashPrefix = "h1:"

// LoadHashKey reads (or creates) the hash key; call it once before Hash.
// It fails with a *seal.MissingKeyError when the key file lacks the key that
// wraps it: Hash then gives nil, and a caller that hashed anyway would not
// match what was hashed under the key (see HashKeyMissing).
func (s *Sealer) LoadHashKey(ctx context.Context, q Querier) error {
	if s == nil || s.Keyed() {
		return nil
	}
	id, _, err := s.liveKey(ctx, q, "", purposeHash)
	if err != nil {
		return fmt.Errorf("hash key: %w", err)
	}
	// The hash key is used as an HMAC key, not as an AEAD: unwrap it again
	// for its bytes.
	var keyID string
	var wrapped []byte
	if err := q.QueryRowContext(ctx, `SELECT key_id, wrapped FROM data_keys WHERE id = $1`, id).Scan(&keyID, &wrapped); err != nil {
		return fmt.Errorf("hash key: %w", err)
	}
	k, err := s.ring.Unwrap(ctx, keyID, wrapped, dekAD(id, "", purposeHash))
	if err != nil {
		return fmt.Errorf("hash key: %w", err)
	}
	s.mu.Lock()
	s.hashK = k
	s.mu.Unlock()
	return nil
}

// Keyed reports whether Hash gives keyed hashes (the hash key is loaded).
func (s *Sealer) Keyed() bool {
	if s == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hashK != nil
}

// Hash returns HMAC-SHA256 of the parts under the hash key, each part
// length-prefixed, as hex; nil if the key is not loaded.
func (s *Sealer) Hash(parts ...[]byte) []byte {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	k := s.hashK
	s.mu.Unlock()
	if k == nil {
		return nil
	}
	m := hmac.New(sha256.New, k)
	for _, p := range parts {
		var n [8]byte
		for i := range n {
			n[i] = byte(uint64(len(p)) >> (8 * (7 - i)))
		}
		m.Write(n[:])
		m.Write(p)
	}
	return m.Sum(nil)
}

// shared holds the Sealer of each key ring a process was given, so that
// the layer, its dispatcher, the operator surface and package query,
// each given the same ring, share one cache of unwrapped data keys and
// one hash key: a KMS ring is then called once per principal and
// process, as the package doc of outbox/seal promises.
var shared sync.Map // seal.KeyRing -> *Sealer

// Of is the Sealer of ring, shared by every caller given the same ring; a
// nil ring is encryption off (a nil *Sealer). A ring whose type cannot be
// a map key (a struct holding a slice, say) gets a Sealer of its own at
// each call, which is correct but caches nothing between callers.
func Of(ring seal.KeyRing) *Sealer {
	if ring == nil {
		return nil
	}
	if !reflect.TypeOf(ring).Comparable() {
		return New(ring)
	}
	if s, ok := shared.Load(ring); ok {
		return s.(*Sealer)
	}
	s, _ := shared.LoadOrStore(ring, New(ring))
	return s.(*Sealer)
}
