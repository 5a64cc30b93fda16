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
