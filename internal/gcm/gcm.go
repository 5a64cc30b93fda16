// Package gcm seals and opens byte strings with AES-256-GCM and a random
// nonce: the data keys a key file wraps (package outbox/seal) and the
// values a data key seals (internal/sealing).
package gcm

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
)

// ErrTampered: a sealed value fails to open under its key: it was
// changed, or copied from another row, column or principal.
var ErrTampered = errors.New("sealed value fails authentication: changed, or copied from another row")

// New is AES-256-GCM under key.
func New(key []byte) (cipher.AEAD, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// Seal returns nonce || ciphertext, with a fresh random nonce: 96 bits
// from crypto/rand, safe for far more values than one data key will seal.
func Seal(aead cipher.AEAD, plain, ad []byte) ([]byte, error) {
	out := make([]byte, aead.NonceSize(), aead.NonceSize()+len(plain)+aead.Overhead())
	if _, err := rand.Read(out); err != nil {
		return nil, err
	}
	return aead.Seal(out, out, plain, ad), nil
}

// Open reverses Seal; anything changed, cut or under another key or
// associated data fails with ErrTampered.
func Open(aead cipher.AEAD, sealed, ad []byte) ([]byte, error) {
	if len(sealed) < aead.NonceSize()+aead.Overhead() {
		return nil, ErrTampered
	}
	plain, err := aead.Open(nil, sealed[:aead.NonceSize()], sealed[aead.NonceSize():], ad)
	if err != nil {
		return nil, ErrTampered
	}
	return plain, nil
}
