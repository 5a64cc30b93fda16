package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/mcp-outbox/mcp-outbox/internal/tokens"
	"github.com/mcp-outbox/mcp-outbox/outbox/bearer"
)

const tokenUsage = `Usage: mcp-outbox token new PRINCIPAL
       mcp-outbox token hash

'token new' prints a new random token (32 bytes, base64url) on stdout and its
tokens-file line on stderr. 'token hash' reads a token on stdin and prints its
SHA-256 in hex, with a warning on stderr when the token is weak (under 32
characters, or too little variety in them): make tokens with 'token new', or
'openssl rand -hex 32'.

Makes bearer tokens for 'mcp-outbox serve --http --tokens FILE'. The file
holds only hashes, so it reveals no token:

  mcp-outbox token new alice 2>>tokens >alice.token

gives alice the token in alice.token and appends 'alice SHA256HEX' to the
file. The hash of the admin token is what --admin-token-sha256 wants:

  mcp-outbox token hash <admin.token
`

// maxTokenInput bounds what 'token hash' reads: a bearer token is a header
// value, far below this.
const maxTokenInput = 64 << 10

func runToken(_ context.Context, env *environment, args []string) error {
	if len(args) > 0 && isHelpFlag(args[0]) {
		fmt.Fprint(env.stdout, tokenUsage)
		return flag.ErrHelp
	}
	if len(args) == 0 {
		return usagef("want 'token new PRINCIPAL' or 'token hash'")
	}
	sub, rest := args[0], args[1:]
	if len(rest) > 0 && isHelpFlag(rest[0]) {
		fmt.Fprint(env.stdout, tokenUsage)
		return flag.ErrHelp
	}
	switch sub {
	case "new":
		if len(rest) != 1 {
			return usagef("token new: want one PRINCIPAL")
		}
		return newToken(env, rest[0])
	case "hash":
		if len(rest) != 0 {
			return usagef("token hash: reads the token on stdin, takes no arguments (an argument would end up in the shell's history)")
		}
		return hashToken(env)
	}
	return usagef("unknown token command %q: want new or hash", sub)
}

func newToken(env *environment, principal string) error {
	if !tokens.ValidPrincipal(principal) {
		return usagef("principal %q: %s", principal, tokens.PrincipalRule)
	}
	token, err := tokens.NewToken()
	if err != nil {
		return err
	}
	fmt.Fprintln(env.stdout, token)
	fmt.Fprintf(env.stderr, "%s %s\n", principal, bearer.Hash(token))
	return nil
}

// The refusals of 'token hash': fixed texts, so that none can repeat the
// token (FuzzTokenHash holds it to that).
var (
	errNoToken    = usagef("token hash: no token on stdin")
	errTokenSpace = usagef("token hash: the token contains white space or a control character, which an Authorization header cannot carry")
	errTokenLarge = fmt.Errorf("read token: more than %d bytes on stdin", maxTokenInput)
)

func hashToken(env *environment) error {
	b, err := io.ReadAll(io.LimitReader(env.stdin, maxTokenInput+1))
	if err != nil {
		return fmt.Errorf("read token: %w", err)
	}
	if len(b) > maxTokenInput {
		return errTokenLarge
	}
	// The trailing newline of `echo` or a file is not part of the token, and
	// no token can contain white space: the Authorization header would
	// split it.
	token := strings.TrimSpace(string(b))
	if token == "" {
		return errNoToken
	}
	if strings.ContainsFunc(token, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return errTokenSpace
	}
	fmt.Fprintln(env.stdout, bearer.Hash(token))
	if weakToken(token) {
		fmt.Fprint(env.stderr, weakTokenWarning)
	}
	return nil
}

// minTokenLen and minTokenBits make a token strong enough for weakToken.
// Only the hash is configured, so 'token hash' is the one place that sees
// a token before it is used; the guess limits (20 wrong tokens a minute
// per address on /mcp, 5 on the operator surface) slow a guesser, but do
// not make a short token safe. A token of 'token new' (43 characters,
// 256 random bits) or of 'openssl rand -hex 32' (64) is far above both.
const (
	minTokenLen  = 32
	minTokenBits = 128
)

// weakTokenWarning is a fixed text, so that it cannot repeat the token.
const weakTokenWarning = "mcp-outbox: WARNING: this token is weak (under 32 characters, or too little variety in them): " +
	"a guesser may find it. Make a strong one with 'mcp-outbox token new PRINCIPAL' or 'openssl rand -hex 32'.\n"

// weakToken reports whether token is short, or carries less than
// minTokenBits by the spread of its characters (the empirical entropy of
// their frequencies, times the length): a guess at the entropy of how it
// was made that is never too high for a random token and catches a
// repeated or patterned one ("aaaa...", "abababab...").
func weakToken(token string) bool {
	rs := []rune(token)
	if len(rs) < minTokenLen {
		return true
	}
	counts := map[rune]int{}
	for _, r := range rs {
		counts[r]++
	}
	bits := 0.0
	for _, c := range counts {
		p := float64(c) / float64(len(rs))
		bits -= float64(c) * math.Log2(p)
	}
	return bits < minTokenBits
}
