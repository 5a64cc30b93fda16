package outbox_test

import (
	"bytes"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var updateReadme = flag.Bool("update-readme", false, "rewrite the README's Go snippets from the code they quote")

// snippetMarker precedes every Go code block of the README and names what
// the block quotes: FILE#NAME, a path from the repository's root and a
// top-level declaration in it. An Example function is quoted by its body,
// anything else (a type, a handler) whole.
var snippetMarker = regexp.MustCompile(`^<!-- snippet: (\S+)#(\S+) -->$`)

// TestREADMESnippets keeps the README's Go snippets true: each one is the
// text of compiled code (mostly Example tests, which run on both stores),
// quoted verbatim, and a Go block that quotes nothing fails the test.
// go test ./outbox -run TestREADMESnippets -update-readme rewrites them.
func TestREADMESnippets(t *testing.T) {
	root := filepath.Join("..")
	path := filepath.Join(root, "README.md")
	readme, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(readme), "\n")
	var out strings.Builder
	quoted := 0
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if strings.TrimSpace(line) != "```go" {
			out.WriteString(line)
			continue
		}
		m := snippetMarker.FindStringSubmatch(strings.TrimSpace(prevLine(lines, i)))
		if m == nil {
			t.Errorf("README.md:%d: a Go block without a '<!-- snippet: FILE#NAME -->' line before it: quote compiled code", i+1)
			out.WriteString(line)
			continue
		}
		end := i + 1
		for end < len(lines) && strings.TrimSpace(lines[end]) != "```" {
			end++
		}
		if end == len(lines) {
			t.Fatalf("README.md:%d: Go block never closed", i+1)
		}
		got := strings.Join(lines[i+1:end], "")
		want, err := quote(filepath.Join(root, m[1]), m[2])
		if err != nil {
			t.Errorf("README.md:%d: %v", i, err)
			want = got
		}
		quoted++
		if got != want && !*updateReadme {
			t.Errorf("README.md:%d: the snippet differs from %s#%s (go test ./outbox -run TestREADMESnippets -update-readme rewrites it):\n--- README\n%s--- %s\n%s", i+1, m[1], m[2], got, m[1], want)
		}
		out.WriteString(line)
		out.WriteString(want)
		out.WriteString(lines[end])
		i = end
	}
	if quoted == 0 {
		t.Error("README.md quotes no code at all: the library section's snippets are gone")
	}
	if *updateReadme && out.String() != string(readme) {
		if err := os.WriteFile(path, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func prevLine(lines []string, i int) string {
	if i == 0 {
		return ""
	}
	return lines[i-1]
}

// quote returns the source of the declaration name in file: an Example
// function's body without its braces and one level of indentation, any
// other declaration whole, with its doc comment.
func quote(file, name string) (string, error) {
	src, err := os.ReadFile(file)
	if err != nil {
		return "", err
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, file, src, parser.ParseComments|parser.SkipObjectResolution)
	if err != nil {
		return "", err
	}
	offset := func(p token.Pos) int { return fset.Position(p).Offset }
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Name.Name != name {
				continue
			}
			if strings.HasPrefix(name, "Example") {
				body := src[offset(d.Body.Lbrace)+1 : offset(d.Body.Rbrace)]
				return dedent(string(bytes.TrimLeft(body, "\n"))), nil
			}
			return declSource(src, offset, d.Doc, d.Pos(), d.End()), nil
		case *ast.GenDecl:
			for _, s := range d.Specs {
				if ts, ok := s.(*ast.TypeSpec); ok && ts.Name.Name == name {
					if d.Lparen.IsValid() {
						return declSource(src, offset, ts.Doc, ts.Pos(), ts.End()), nil
					}
					return declSource(src, offset, d.Doc, d.Pos(), d.End()), nil
				}
			}
		}
	}
	return "", fmt.Errorf("%s has no top-level declaration %s", file, name)
}

func declSource(src []byte, offset func(token.Pos) int, doc *ast.CommentGroup, pos, end token.Pos) string {
	start := offset(pos)
	if doc != nil {
		start = offset(doc.Pos())
	}
	return string(src[start:offset(end)]) + "\n"
}

// dedent removes one tab from the start of every line, and the "// Output:"
// comment that ends an Example, which is for go test, not for the reader.
func dedent(s string) string {
	lines := strings.SplitAfter(s, "\n")
	var b strings.Builder
	for _, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), "// Output:") || strings.HasPrefix(strings.TrimSpace(l), "// Unordered output:") {
			break
		}
		b.WriteString(strings.TrimPrefix(l, "\t"))
	}
	return strings.TrimRight(b.String(), "\n\t ") + "\n"
}
