package queen_test

import (
	"bufio"
	"bytes"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// readmeGivens are the names README snippets use without declaring them:
// what a reader's surrounding code would have. Each snippet is type-checked
// as the body of a function taking them.
const readmeGivens = `ctx context.Context, url string, payload []byte, items []queen.Item,
	m *queen.Message, pgxTx pgx.Tx, tenantID uuid.UUID, handle func([]byte) error`

// readmeImports are the packages a snippet may use by their package name;
// a snippet imports those whose name it mentions.
var readmeImports = map[string]string{
	"context": "context",
	"errors":  "errors",
	"fmt":     "fmt",
	"log":     "log",
	"os":      "os",
	"signal":  "os/signal",
	"syscall": "syscall",
	"time":    "time",
	"queen":   "github.com/e03140bc/queen",
	"pgx":     "github.com/jackc/pgx/v5",
	"uuid":    "github.com/gofrs/uuid/v5",
	// Only in whole-file snippets, which import them themselves.
	"testing":   "testing",
	"queentest": "github.com/e03140bc/queen/queentest",
}

type readmeSnippet struct {
	line int // of the opening fence
	code string
}

// readmeSnippets returns README.md's ```go blocks. Blocks fenced as
// ```go-fragment are illustrations not meant to compile, and are skipped.
func readmeSnippets(t *testing.T) []readmeSnippet {
	t.Helper()
	f, err := os.Open("README.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []readmeSnippet
	var cur *readmeSnippet
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case cur == nil && strings.TrimSpace(line) == "```go":
			cur = &readmeSnippet{line: n}
		case cur != nil && strings.TrimSpace(line) == "```":
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.code += line + "\n"
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if cur != nil {
		t.Fatalf("README.md:%d: unterminated ```go block", cur.line)
	}
	return out
}

// readmeSource wraps a snippet in a file: as is when it is a whole file
// (starts with package), else as a block inside a function taking
// readmeGivens, so it may redeclare them. It returns the file and the line
// of the file where the snippet's first line lands.
func readmeSource(code string) (string, int) {
	if strings.HasPrefix(strings.TrimSpace(code), "package ") {
		return code, 1
	}
	var b strings.Builder
	b.WriteString("package readme\n\nimport (\n")
	used := []string{"context", "queen", "pgx", "uuid"} // the givens' types
	for name := range readmeImports {
		if !slices.Contains(used, name) && regexp.MustCompile(`\b`+name+`\.`).MatchString(code) {
			used = append(used, name)
		}
	}
	slices.Sort(used)
	for _, name := range used {
		fmt.Fprintf(&b, "\t%q\n", readmeImports[name])
	}
	b.WriteString(")\n\nfunc snippet(" + readmeGivens + ") {\n\t{\n")
	first := strings.Count(b.String(), "\n") + 1
	b.WriteString(code)
	b.WriteString("\t}\n}\n")
	return b.String(), first
}

// readmeExports maps import paths (and their dependencies) to export data
// built by the go command, so the snippets are checked against the code in
// this tree without a network or a separate module.
func readmeExports(t *testing.T) map[string]string {
	t.Helper()
	args := []string{"list", "-export", "-deps", "-f", "{{.ImportPath}}\t{{.Export}}"}
	for _, p := range readmeImports {
		args = append(args, p)
	}
	var stderr bytes.Buffer
	cmd := exec.Command("go", args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.Bytes())
	}
	exports := map[string]string{}
	for line := range strings.Lines(string(out)) {
		path, file, _ := strings.Cut(strings.TrimSpace(line), "\t")
		if file != "" {
			exports[path] = file
		}
	}
	return exports
}

// TestREADMEGoSnippetsCompile type-checks every ```go block of README.md
// against the packages of this tree. A fragment's unused variables are
// allowed (a reader's code goes on to use them); every other error fails.
func TestREADMEGoSnippetsCompile(t *testing.T) {
	snippets := readmeSnippets(t)
	if len(snippets) == 0 {
		t.Fatal("README.md has no ```go blocks")
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command to build export data:", err)
	}
	exports := readmeExports(t)
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		f, ok := exports[path]
		if !ok {
			return nil, fmt.Errorf("no export data for %q", path)
		}
		return os.Open(f)
	})
	for _, s := range snippets {
		t.Run(fmt.Sprintf("line%d", s.line), func(t *testing.T) {
			src, first := readmeSource(s.code)
			for _, e := range readmeCheck(fset, imp, src) {
				// Report at the README's line.
				line := s.line + 1 + e.Line - first
				t.Errorf("README.md:%d: %s\n%s", line, e.Msg, readmeLine(s.code, e.Line-first))
			}
		})
	}
}

type readmeError struct {
	Line int // in the generated file
	Msg  string
}

func readmeCheck(fset *token.FileSet, imp types.Importer, src string) []readmeError {
	f, err := parser.ParseFile(fset, "snippet.go", src, parser.SkipObjectResolution)
	if err != nil {
		var errs []readmeError
		if list, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range list.Unwrap() {
				errs = append(errs, parseError(fset, e))
			}
			return errs
		}
		return []readmeError{parseError(fset, err)}
	}
	var errs []readmeError
	conf := types.Config{
		Importer: imp,
		Error: func(err error) {
			te := err.(types.Error)
			if strings.Contains(te.Msg, "declared and not used") {
				return
			}
			errs = append(errs, readmeError{fset.Position(te.Pos).Line, te.Msg})
		},
	}
	_, _ = conf.Check("readme", fset, []*ast.File{f}, nil)
	return errs
}

func parseError(fset *token.FileSet, err error) readmeError {
	var line int
	msg := err.Error()
	if _, after, ok := strings.Cut(msg, "snippet.go:"); ok {
		fmt.Sscanf(after, "%d", &line)
	}
	return readmeError{line, msg}
}

func readmeLine(code string, i int) string {
	lines := strings.Split(code, "\n")
	if i < 0 || i >= len(lines) {
		return ""
	}
	return "\t" + strings.TrimSpace(lines[i])
}
