package outbox

import (
	"os"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
)

// The span attributes are not exported: the package doc lists them for
// users who filter spans, so every one must be there.
func TestDoc_ListsSpanAttributes(t *testing.T) {
	b, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []attribute.Key{attrKeySource, attrOutcome, attrKeyHash, attrCallID, attrEffects, attrRecorded} {
		if !strings.Contains(string(b), "//\t"+string(k)+" ") {
			t.Errorf("doc.go does not list span attribute %s", k)
		}
	}
}

// The lifecycle sketch is what users copy: it must serve HTTP with the
// handler that keeps a top-level params.idempotencyKey, not go-sdk's own,
// which drops it without a word.
func TestDoc_SketchKeepsEveryKeySource(t *testing.T) {
	b, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "//\t") && strings.Contains(line, "mcp.NewStreamableHTTPHandler") {
			t.Errorf("doc.go's sketch serves HTTP with mcp.NewStreamableHTTPHandler, which drops params.idempotencyKey: %s", line)
		}
	}
	if !strings.Contains(string(b), "mcphttp.NewHandler(server") {
		t.Error("doc.go's lifecycle sketch does not serve HTTP with mcphttp.NewHandler")
	}
}
