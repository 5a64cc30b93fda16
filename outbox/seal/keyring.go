package seal

import (
	"bufio"
	"bytes"
	"context"
	"crypto/cipher"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"strings"
	"unicode"

	"github.com/mcp-outbox/mcp-outbox/internal/gcm"
)

// KeySize is the size of every key: AES-256.
const KeySize = 32

// A KeyRing wraps and unwraps data keys with key-encryption keys named by
// id. Implementations must be safe for concurrent use.
type KeyRing interface {
	// Current is the id of the key that wraps new data keys.
	Current() string
	// Has reports whether the ring can unwrap what keyID wrapped.
	Has(keyID string) bool
	// Wrap encrypts a data key under keyID, bound to ad.
	Wrap(ctx context.Context, keyID string, dek, ad []byte) ([]byte, error)
	// Unwrap reverses Wrap; it fails with a *MissingKeyError when the ring
	// has no key keyID.
	Unwrap(ctx context.Context, keyID string, wrapped, ad []byte) ([]byte, error)
}

// MissingKeyError: a value needs a key the key ring lacks.
type MissingKeyError struct{ KeyID string }

func (e *MissingKeyError) Error() string {
	// A process reads the key file once, at start: a key added to the
	// file since (and a reencrypt under it) is missing here too, and the
	// operator must learn that a restart, not the file, is what's lacking.
	return fmt.Sprintf("encryption key %q is not in the key file as this process loaded it at start (it wrapped this row's data key): "+
		"a process must be restarted after its key file changes; if the key is not in the file, restore it "+
		"(or run 'mcp-outbox outbox reencrypt' with it before removing it)", e.KeyID)
}

// FileKeyRing is a KeyRing of keys read from a key file.
type FileKeyRing struct {
	ids  []string
	keys map[string]cipher.AEAD
}

// LoadKeyFile reads a key file: one key a line as 'ID:BASE64', BASE64 the
// standard encoding of 32 random bytes ('openssl rand -base64 32'); blank
// lines and lines starting with '#' are skipped. The first key wraps new
// data keys; all of them unwrap.
//
// The file holds what every stored value's secrecy rests on, so one that
// others may read is refused, as ssh refuses a private key: mode 0600 or
// 0400, or, for a file owned by root, 0640 or 0440, as PostgreSQL allows
// its server key. That exception is the mounted secret: Kubernetes makes a
// secret's files root's and, with an fsGroup, readable by that group, and
// the process (not root, and not able to chmod a read-only volume) reads it
// through the group.
func LoadKeyFile(path string) (*FileKeyRing, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("key file: %w", err)
	}
	if err := checkKeyFileMode(path, fi); err != nil {
		return nil, err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("key file: %w", err)
	}
	r, err := ParseKeys(data)
	if err != nil {
		return nil, fmt.Errorf("key file %s: %w", path, err)
	}
	return r, nil
}

// checkKeyFileMode refuses a key file that others than its owner may read
// or change, but a root-owned one readable by its group.
func checkKeyFileMode(path string, fi os.FileInfo) error {
	perm := fi.Mode().Perm()
	switch {
	case perm&0o007 != 0:
		return fmt.Errorf("key file %s: mode %v lets every user of this host read or change it; chmod 600 it", path, perm)
	case perm&0o070 == 0, perm&0o070 == 0o040 && ownedByRoot(fi):
		return nil
	}
	return fmt.Errorf("key file %s: mode %v lets its group read or change it; chmod 600 it "+
		"(a file owned by root may be 0640, for a mounted secret a group reads)", path, perm)
}

// ParseKeys reads keys in the format of a key file (see [LoadKeyFile]).
func ParseKeys(data []byte) (*FileKeyRing, error) {
	r := &FileKeyRing{keys: map[string]cipher.AEAD{}}
	// A file saved by a Windows editor may begin with a byte order mark,
	// which would otherwise become part of the first key's id: an id
	// that looks like "k1" and is not, so that the same key written
	// without it (the next key file, at rotation) would be missing.
	data = bytes.TrimPrefix(data, []byte("\ufeff"))
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		id, b64, ok := strings.Cut(line, ":")
		if !ok || id == "" {
			return nil, fmt.Errorf("line %d: want ID:BASE64(32 bytes)", n)
		}
		if strings.ContainsAny(id, " \t:") {
			return nil, fmt.Errorf("line %d: key id %q has a space or a colon", n, id)
		}
		// Ids are stored with every data key and named in messages: one
		// with a character that does not show would be a key an operator
		// cannot tell from another.
		if i := strings.IndexFunc(id, func(c rune) bool { return !unicode.IsGraphic(c) || unicode.IsSpace(c) }); i >= 0 {
			return nil, fmt.Errorf("line %d: key id %q has an invisible character (%U)", n, id, []rune(id[i:])[0])
		}
		if _, dup := r.keys[id]; dup {
			return nil, fmt.Errorf("line %d: key id %q given twice", n, id)
		}
		key, err := base64.StdEncoding.DecodeString(strings.TrimSpace(b64))
		if err != nil {
			return nil, fmt.Errorf("line %d (key %q): not base64 (standard, padded): %v; %s", n, id, err, makeOne)
		}
		if len(key) != KeySize {
			return nil, fmt.Errorf("line %d (key %q): %d bytes, want %d; %s", n, id, len(key), KeySize, makeOne)
		}
		a, err := gcm.New(key)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		r.ids = append(r.ids, id)
		r.keys[id] = a
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(r.ids) == 0 {
		return nil, errors.New("no key in it")
	}
	return r, nil
}

// makeOne ends the errors about a key's bytes: the size is AES-256's, and a
// hex string, a passphrase or a 64-byte secret made for something else is
// refused rather than cut or stretched.
const makeOne = "make a key with 'openssl rand -base64 32'"

// Current is the first key's id.
func (r *FileKeyRing) Current() string { return r.ids[0] }

// IDs lists the keys' ids in file order.
func (r *FileKeyRing) IDs() []string { return append([]string(nil), r.ids...) }

// Has reports whether the file has key id.
func (r *FileKeyRing) Has(id string) bool { _, ok := r.keys[id]; return ok }

// Wrap seals dek under key id.
func (r *FileKeyRing) Wrap(_ context.Context, id string, dek, ad []byte) ([]byte, error) {
	a, ok := r.keys[id]
	if !ok {
		return nil, &MissingKeyError{KeyID: id}
	}
	return gcm.Seal(a, dek, ad)
}

// Unwrap opens what Wrap sealed.
func (r *FileKeyRing) Unwrap(_ context.Context, id string, wrapped, ad []byte) ([]byte, error) {
	a, ok := r.keys[id]
	if !ok {
		return nil, &MissingKeyError{KeyID: id}
	}
	return gcm.Open(a, wrapped, ad)
}
