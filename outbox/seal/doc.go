// Package seal holds the keys with which the layer encrypts what it stores
// about a call that may hold personal data (recorded results, task
// arguments, effect bodies and headers): give outbox.Options.Keys a
// [KeyRing], from [LoadKeyFile] or a KMS of your own. It is envelope
// encryption with a data key per principal:
//
//   - A [KeyRing] holds the key-encryption keys (KEKs), each under an id.
//     The one implementation, [LoadKeyFile], reads them from a file of
//     'ID:BASE64(32 bytes)' lines; the first line's key wraps new data
//     keys, every line's key unwraps.
//   - Each principal gets a random 256-bit data key (DEK), stored wrapped
//     by a KEK in the table data_keys with the KEK's id. A value is sealed
//     with AES-256-GCM under its principal's DEK, with a fresh random nonce
//     and associated data naming the row, the column and the principal, so
//     that a value copied to another row, column or principal fails to
//     open. The sealed value names its DEK ('mcpo1:DEKID:BASE64').
//   - Forgetting a principal (mcp-outbox encryption forget-principal) is
//     crypto-erasure: the wrapped DEK is deleted (its row is kept, with
//     erased_at), so every value sealed
//     under it, in the database, its WAL, PostgreSQL's dead tuples, and
//     every backup taken after the erase together with any copy of the key
//     file, is noise. Backups taken before the erase still hold the wrapped
//     DEK: whoever holds such a backup and the key file reads them.
//   - Rotation rewraps the DEKs under the current KEK (outbox reencrypt);
//     the values themselves do not change, so rotation costs one row per
//     principal, and the old KEK can then leave the key file.
//
// Hashes that would give arguments away (a call's args_hash and
// fingerprint) are keyed: HMAC-SHA256 under a random hash key stored,
// wrapped like a DEK, in data_keys.
//
// # A KMS
//
// A KMS plugs in as another [KeyRing]: Current names the KMS key that wraps
// new data keys, Wrap and Unwrap call the KMS's encrypt and decrypt with
// the associated data as its encryption context, and Has reports whether
// the KMS knows a key id. The layer caches unwrapped data keys by DEK id
// and wrapped bytes, shared by everything in the process given the same
// ring (the layer, a dispatcher, the operator surface, package query), so
// the KMS is called once per principal and process, not once per value; erasure does not depend on that cache, because every
// Open reads the DEK's row first and refuses an erased one.
package seal
