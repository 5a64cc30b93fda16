package outbox_test

import (
	"bytes"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
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

// TestREADMELayout keeps the README's Layout table true: a well-formed
// table that names every package of the module, and whose layers hold, as
// the text above it says: no package imports one of a higher layer (tests'
// own imports aside). Packages of the "test" layer rank with the
// applications: only they, and tests, may use them.
func TestREADMELayout(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	readme, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n## Layout\n")
	if !ok {
		t.Fatal("README.md has no Layout section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	rank := map[string]int{"foundation": 0, "library": 1, "surface": 2, "application": 3, "test": 3}
	layerOf := map[string]string{} // a directory, as "path/", to its layer
	header := -1
	for i, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "|") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if header < 0 {
			header = len(cells)
			continue
		}
		if len(cells) != header {
			t.Errorf("Layout table, line %d of the section: %d cells, the header has %d: %s", i+1, len(cells), header, line)
			continue
		}
		layer := strings.TrimSpace(cells[0])
		if strings.Trim(layer, "-") == "" {
			continue // the separator
		}
		if _, known := rank[layer]; !known {
			t.Errorf("Layout table: unknown layer %q in %s", layer, line)
			continue
		}
		for _, m := range regexp.MustCompile("`([a-z0-9_./-]+/)`").FindAllStringSubmatch(cells[1], -1) {
			layerOf[m[1]] = layer
		}
	}
	if header < 0 {
		t.Fatal("README.md's Layout section has no table")
	}

	// From the module's root: "./..." from here would list outbox's
	// packages alone and leave the rest of the table unchecked.
	list := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "./...")
	list.Dir = ".."
	out, err := list.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	const module = "github.com/mcp-outbox/mcp-outbox/"
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		dir := strings.TrimPrefix(fields[0], module) + "/"
		layer, listed := layerOf[dir]
		if !listed {
			t.Errorf("README.md's Layout table does not name package %s", dir)
			continue
		}
		for _, imp := range fields[1:] {
			if !strings.HasPrefix(imp, module) {
				continue
			}
			to := strings.TrimPrefix(imp, module) + "/"
			if l, ok := layerOf[to]; ok && rank[l] > rank[layer] {
				t.Errorf("%s (%s) imports %s (%s), a higher layer", dir, layer, to, l)
			}
		}
	}
}
