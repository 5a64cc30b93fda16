package visible

import (
	"encoding/json"
	"testing"
)

func TestText(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"toolu_01abc":                  "toolu_01abc",
		"x\u202egpj.exe":               "x<U+202E>gpj.exe",
		"a\u200bb\ufeffc\u2066d\u2069": "a<U+200B>b<U+FEFF>c<U+2066>d<U+2069>",
		"tag\U000E0041":                "tag<U+E0041>",
		"bell\a, line\nbreak\ttab":     "bell<U+0007>, line\nbreak\ttab",
		"é 日本 \u2028":                  "é 日本 \u2028", // a line separator is drawn as a break, not hidden
	} {
		if got := Text(in); got != want {
			t.Errorf("Text(%q) = %q, want %q", in, got, want)
		}
	}
	if got := string(HTML([]byte(`<p title="x` + "\u202e" + `y">a` + "\u200f" + `</p>`))); got != `<p title="x&lt;U+202E&gt;y">a&lt;U+200F&gt;</p>` {
		t.Errorf("HTML: %s", got)
	}
}

// TestJSON: the escaped JSON is the same value, and holds no format
// character, inside the Basic Multilingual Plane or beyond it.
func TestJSON(t *testing.T) {
	t.Parallel()
	v := map[string]string{"id": "x\u202egpj.exe", "tag": "a\U000E0041b", "plain": "é\n"}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	got := JSON(b)
	want := `{"id":"x\u202egpj.exe","plain":"é\n","tag":"a\udb40\udc41b"}`
	if string(got) != want {
		t.Errorf("JSON = %s, want %s", got, want)
	}
	var back map[string]string
	if err := json.Unmarshal(got, &back); err != nil || back["id"] != v["id"] || back["tag"] != v["tag"] {
		t.Errorf("round trip: %q, %v", back, err)
	}
}
