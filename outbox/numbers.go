package outbox

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"strconv"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Numbers in tool arguments.
//
// The go-sdk's typed tool handlers (mcp.AddTool, and so [AddTool]) validate
// the arguments by decoding them into map[string]any, where every number
// becomes a float64, and encode that map again before decoding it into the
// tool's input type (applySchema in the SDK's mcp/tool.go). A number literal
// whose value a float64 does not hold reaches the handler changed, without an
// error: {"amount": 9007199254740993} arrives as 9007199254740992, 1e-400 as
// 0, 0.10000000000000000001 as 0.1. The layer keys calls on the arguments as
// sent, so 9007199254740993 and 9007199254740992 would even be two different
// calls that both run with the second amount.
//
// The layer refuses such a call, before claiming it, with a tool error that
// names the argument and its value; nothing runs. It does not carry the
// literal through exactly, because:
//
//   - that would mean replacing the SDK's validation and decoding for every
//     tool (its JSON Schema validator works on float64, not on decimal
//     strings), a fork of mcp.AddTool's behaviour; and the SDK's output step
//     does the same float64 round trip on structured results, so the value
//     would still change on its way back;
//   - RFC 8259 (section 6) and I-JSON (RFC 7493, section 2.2) say numbers
//     beyond IEEE 754 double precision are not interoperable: JavaScript
//     clients cannot even send 9007199254740993. A client that needs such
//     values sends them as strings;
//   - a refusal is visible and costs a corrected retry; a changed amount,
//     once charged, cannot be taken back.
//
// Only literals whose value changes are refused: 0.1, 1e20, 1.0, -0 and
// 5e-324 survive the round trip and pass. A literal beyond float64's range
// (1e400) is refused here too, with the same clear error, instead of the
// SDK's "unmarshaling arguments" error.

// maxExactInteger is the largest integer up to which float64 holds every
// integer exactly (2^53 - 1).
const maxExactInteger = 1<<53 - 1

// checkNumbers returns the tool error for arguments holding a number literal
// that does not survive a float64 round trip, or nil. It is one pass over the
// bytes, without decoding them: the layer's hot path already canonicalises
// the arguments of recorded calls, and this must not add a second decode.
func checkNumbers(args json.RawMessage) *mcp.CallToolResult {
	lit, off, found := inexactNumber(args)
	if !found {
		return nil
	}
	path := argumentPath(args, off)
	where := "argument " + strconv.Quote(path)
	if path == "" {
		where = "the arguments"
	}
	f, err := strconv.ParseFloat(string(lit), 64)
	if err != nil || math.IsInf(f, 0) {
		return toolError(codeInvalidArguments,
			"%s is %s, a number outside the range of 64-bit floating point, through which this server's tool arguments pass; "+
				"nothing was executed. Send a number within that range, or a string if the tool accepts one.",
			where, shortLiteral(lit))
	}
	return toolError(codeInvalidArguments,
		"%s is %s, a number that 64-bit floating point, through which this server's tool arguments pass, cannot hold exactly: "+
			"it would reach the tool as %s. Nothing was executed. Send a number that 64-bit floating point holds exactly "+
			"(integers between -%d and %d), or a string if the tool accepts one.",
		where, shortLiteral(lit), jsonFloat(f), maxExactInteger, maxExactInteger)
}

// inexactNumber finds the first number literal in the JSON text data whose
// value a float64 does not hold, and its offset.
func inexactNumber(data []byte) (lit []byte, off int, found bool) {
	for i := 0; i < len(data); {
		switch c := data[i]; {
		case c == '"':
			i = skipString(data, i+1)
		case c == '-' || '0' <= c && c <= '9':
			// Outside strings only numbers hold '-' or digits.
			j := i + 1
			for j < len(data) && isNumberByte(data[j]) {
				j++
			}
			if !survivesFloat64(data[i:j]) {
				return data[i:j], i, true
			}
			i = j
		default:
			i++
		}
	}
	return nil, 0, false
}

func isNumberByte(c byte) bool {
	return '0' <= c && c <= '9' || c == '.' || c == 'e' || c == 'E' || c == '-' || c == '+'
}

// skipString returns the index just after the closing quote of the string
// whose contents begin at i (len(data) if it never closes).
func skipString(data []byte, i int) int {
	for {
		q := bytes.IndexByte(data[i:], '"')
		if q < 0 {
			return len(data)
		}
		q += i
		// The quote closes the string unless an odd number of backslashes
		// escape it.
		n := 0
		for k := q - 1; k >= i && data[k] == '\\'; k-- {
			n++
		}
		if n%2 == 0 {
			return q + 1
		}
		i = q + 1
	}
}

// survivesFloat64 reports whether the number literal lit has the same value
// as the float64 nearest to it, written as Go writes floats: whether the
// SDK's round trip leaves it unchanged.
func survivesFloat64(lit []byte) bool {
	digits, exponent := 0, false
	for _, c := range lit {
		switch {
		case '0' <= c && c <= '9':
			digits++
		case c == 'e' || c == 'E':
			exponent = true
		}
	}
	// The common case, decided without parsing: a float64 holds 15
	// significant decimal digits (DBL_DIG), so a literal of at most 15
	// digits and no exponent, at most 10^15 in size, comes back as itself.
	if !exponent && digits <= 15 {
		return true
	}
	f, err := strconv.ParseFloat(string(lit), 64)
	if err != nil {
		// Out of range (±Inf), or not a number at all: then the arguments
		// are not valid JSON, which the SDK reports.
		return errors.Is(err, strconv.ErrSyntax)
	}
	var buf [32]byte
	return decimalOf(lit) == decimalOf(strconv.AppendFloat(buf[:0], f, 'e', -1, 64))
}

// decimal is the value of a number literal: 0.digits × 10^exp, negative if
// neg, with no leading or trailing zeros in digits. Zero, of either sign,
// is the zero value.
type decimal struct {
	neg    bool
	digits string
	exp    int
}

func decimalOf(lit []byte) decimal {
	i := 0
	neg := false
	if i < len(lit) && (lit[i] == '-' || lit[i] == '+') {
		neg = lit[i] == '-'
		i++
	}
	digits := make([]byte, 0, len(lit))
	point := -1 // digits before the decimal point
	for ; i < len(lit) && lit[i] != 'e' && lit[i] != 'E'; i++ {
		if lit[i] == '.' {
			point = len(digits)
			continue
		}
		digits = append(digits, lit[i])
	}
	if point < 0 {
		point = len(digits)
	}
	exp := 0
	if i < len(lit) {
		i++
		eneg := false
		if i < len(lit) && (lit[i] == '-' || lit[i] == '+') {
			eneg = lit[i] == '-'
			i++
		}
		for ; i < len(lit); i++ {
			if exp < 1e8 { // beyond any float64; only a zero survives it
				exp = exp*10 + int(lit[i]-'0')
			}
		}
		if eneg {
			exp = -exp
		}
	}
	lead := 0
	for lead < len(digits) && digits[lead] == '0' {
		lead++
	}
	digits, point = digits[lead:], point-lead
	digits = bytes.TrimRight(digits, "0")
	if len(digits) == 0 {
		return decimal{}
	}
	return decimal{neg: neg, digits: string(digits), exp: point + exp}
}

// jsonFloat writes f as encoding/json does, which is what the handler's
// input is decoded from.
func jsonFloat(f float64) string {
	b, err := json.Marshal(f)
	if err != nil {
		return strconv.FormatFloat(f, 'g', -1, 64)
	}
	return string(b)
}

// shortLiteral keeps an error message short when a literal is not.
func shortLiteral(lit []byte) string {
	const limit = 40
	if len(lit) <= limit {
		return string(lit)
	}
	return string(lit[:limit/2]) + "…" + string(lit[len(lit)-limit/2:]) + " (" + strconv.Itoa(len(lit)) + " characters)"
}

// argumentPath is the JSON Pointer (RFC 6901) of the value that begins at
// offset off of the JSON text data: "/items/2/amount". It scans the bytes
// before off once, keeping one frame per open object or array, and never
// recurses. It only runs for a call being refused.
func argumentPath(data []byte, off int) string {
	type frame struct {
		array   bool
		index   int
		key     []byte // the member's key as written, quotes included
		wantKey bool   // the next string in this object is a key
	}
	var stack []frame
	for i := 0; i < off && i < len(data); {
		switch data[i] {
		case '"':
			j := skipString(data, i+1)
			if n := len(stack); n > 0 && stack[n-1].wantKey {
				stack[n-1].key, stack[n-1].wantKey = data[i:j], false
			}
			i = j
			continue
		case '{':
			stack = append(stack, frame{wantKey: true})
		case '[':
			stack = append(stack, frame{array: true})
		case '}', ']':
			if len(stack) > 0 {
				stack = stack[:len(stack)-1]
			}
		case ',':
			if n := len(stack); n > 0 {
				if stack[n-1].array {
					stack[n-1].index++
				} else {
					stack[n-1].wantKey = true
				}
			}
		}
		i++
	}
	var b strings.Builder
	escape := strings.NewReplacer("~", "~0", "/", "~1")
	for _, f := range stack {
		b.WriteByte('/')
		if f.array {
			b.WriteString(strconv.Itoa(f.index))
			continue
		}
		var key string
		_ = json.Unmarshal(f.key, &key)
		b.WriteString(escape.Replace(key))
	}
	return b.String()
}
