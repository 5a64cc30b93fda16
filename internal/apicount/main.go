// Command apicount counts the exported identifiers of Go packages: the
// top-level functions, types, constants and variables whose names are
// exported, and the exported methods of exported types. Struct fields and
// interface methods are not counted. It is how the size of the public API
// is measured and reported:
//
//	go run ./internal/apicount outbox outbox/operator query schema
//
// With -v it lists the identifiers too.
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

func main() {
	verbose := flag.Bool("v", false, "list the identifiers")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: apicount [-v] DIR...")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	total := 0
	for _, dir := range flag.Args() {
		names, err := exported(dir)
		if err != nil {
			fmt.Fprintln(os.Stderr, "apicount:", err)
			os.Exit(1)
		}
		fmt.Printf("%-24s %4d\n", dir, len(names))
		if *verbose {
			for _, n := range names {
				fmt.Printf("    %s\n", n)
			}
		}
		total += len(names)
	}
	if flag.NArg() > 1 {
		fmt.Printf("%-24s %4d\n", "total", total)
	}
}

// exported lists the exported identifiers declared in dir's non-test Go
// files, as "kind Name" (methods as "method Type.Name").
func exported(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read package directory: %w", err)
	}
	fset := token.NewFileSet()
	var names []string
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, fmt.Errorf("parse: %w", err)
		}
		if f.Name.Name == "main" {
			continue
		}
		names = append(names, declared(f)...)
	}
	sort.Strings(names)
	return names, nil
}

func declared(f *ast.File) []string {
	var names []string
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() {
				continue
			}
			if d.Recv == nil {
				names = append(names, "func "+d.Name.Name)
				continue
			}
			if recv := receiverType(d.Recv.List[0].Type); ast.IsExported(recv) {
				names = append(names, "method "+recv+"."+d.Name.Name)
			}
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					if s.Name.IsExported() {
						names = append(names, "type "+s.Name.Name)
					}
				case *ast.ValueSpec:
					for _, id := range s.Names {
						if id.IsExported() {
							names = append(names, strings.ToLower(d.Tok.String())+" "+id.Name)
						}
					}
				}
			}
		}
	}
	return names
}

// receiverType is the name of a method's receiver type, without pointer
// or type parameters.
func receiverType(e ast.Expr) string {
	for {
		switch t := e.(type) {
		case *ast.StarExpr:
			e = t.X
		case *ast.IndexExpr:
			e = t.X
		case *ast.IndexListExpr:
			e = t.X
		case *ast.Ident:
			return t.Name
		default:
			return ""
		}
	}
}
