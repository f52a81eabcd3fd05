package examples

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
)

// iamActions maps a DynamoDB API operation to the IAM actions it needs. A
// transaction has no IAM action of its own: it is authorized by the
// actions it carries, and Sluice's carry puts and updates.
func iamActions(op string) []string {
	if op == "TransactWriteItems" {
		return []string{"dynamodb:PutItem", "dynamodb:UpdateItem"}
	}
	return []string{"dynamodb:" + op}
}

// calledOps returns the DynamoDB operations called in the non-test Go
// files of dir that keep accepts: any call x.Op(...) whose Op is a method
// of *dynamodb.Client, and the operations of any function of the package
// such a file calls that makes them itself (batchGet, shared by the
// backend and the operator's commands).
func calledOps(t *testing.T, dir string, keep func(file string) bool) []string {
	t.Helper()
	api := map[string]bool{}
	ct := reflect.TypeFor[*dynamodb.Client]()
	for i := 0; i < ct.NumMethod(); i++ {
		api[ct.Method(i).Name] = true
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	// opsIn lists the operations called directly under n.
	opsIn := func(n ast.Node) []string {
		var ops []string
		ast.Inspect(n, func(n ast.Node) bool {
			if call, ok := n.(*ast.CallExpr); ok {
				if sel, ok := call.Fun.(*ast.SelectorExpr); ok && api[sel.Sel.Name] && sel.Sel.Name != "Options" {
					ops = append(ops, sel.Sel.Name)
				}
			}
			return true
		})
		return ops
	}
	parsed := map[string]*ast.File{}
	helpers := map[string][]string{} // package-level function -> the operations it calls
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(token.NewFileSet(), f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		parsed[f] = file
		for _, d := range file.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv == nil {
				helpers[fn.Name.Name] = opsIn(fn)
			}
		}
	}
	seen := map[string]bool{}
	for f, file := range parsed {
		if !keep(filepath.Base(f)) {
			continue
		}
		for _, op := range opsIn(file) {
			seen[op] = true
		}
		ast.Inspect(file, func(n ast.Node) bool {
			if call, ok := n.(*ast.CallExpr); ok {
				if id, ok := call.Fun.(*ast.Ident); ok {
					for _, op := range helpers[id.Name] {
						seen[op] = true
					}
				}
			}
			return true
		})
	}
	var ops []string
	for op := range seen {
		ops = append(ops, op)
	}
	slices.Sort(ops)
	return ops
}

type policy struct {
	Version   string
	Statement []struct {
		Sid      string
		Effect   string
		Action   []string
		Resource []string
	}
}

// The IAM policy in examples/ grants exactly what the code calls: every
// DynamoDB operation Sluice makes is allowed, and nothing else is, so the
// policy cannot drift from the code in either direction.
func TestIAMPolicyMatchesTheCode(t *testing.T) {
	data, err := os.ReadFile("iam-policy.json")
	if err != nil {
		t.Fatal(err)
	}
	var p policy
	if err := json.Unmarshal(data, &p); err != nil {
		t.Fatalf("iam-policy.json: %v", err)
	}
	if p.Version != "2012-10-17" {
		t.Errorf("policy version %q", p.Version)
	}
	backendDir := filepath.Join("..", "backend", "dynamodb")
	want := map[string][]string{
		// sluice serve: the backend, except table management and the
		// operator's commands.
		"SluiceServe": calledOps(t, backendDir, func(f string) bool { return f != "table.go" && !strings.HasPrefix(f, "admin") }),
		// sluice table create.
		"SluiceTableCreate": calledOps(t, backendDir, func(f string) bool { return f == "table.go" }),
		// sluice limits, entity and buckets.
		"SluiceAdmin": calledOps(t, backendDir, func(f string) bool { return strings.HasPrefix(f, "admin") }),
	}
	if len(want["SluiceServe"]) < 5 || len(want["SluiceTableCreate"]) < 3 || len(want["SluiceAdmin"]) < 6 {
		t.Fatalf("found too few calls to check; is the parser looking at the right files? %v", want)
	}
	for _, st := range p.Statement {
		ops, ok := want[st.Sid]
		if !ok {
			t.Errorf("statement %q: no code it is for", st.Sid)
			continue
		}
		delete(want, st.Sid)
		// The table, and its indexes only for a statement that queries
		// them (the operator's commands list children and buckets).
		wantRes := []string{"arn:aws:dynamodb:*:*:table/sluice"}
		if slices.Contains(ops, "Query") {
			wantRes = append(wantRes, "arn:aws:dynamodb:*:*:table/sluice/index/*")
		}
		if st.Effect != "Allow" || !slices.Equal(st.Resource, wantRes) {
			t.Errorf("statement %s: effect %s resources %v, want Allow on %v", st.Sid, st.Effect, st.Resource, wantRes)
		}
		var needed []string
		for _, op := range ops {
			needed = append(needed, iamActions(op)...)
		}
		slices.Sort(needed)
		needed = slices.Compact(needed)
		have := slices.Sorted(slices.Values(st.Action))
		if !slices.Equal(have, needed) {
			t.Errorf("statement %s allows %v; the code (%v) needs exactly %v", st.Sid, have, ops, needed)
		}
	}
	for sid := range want {
		t.Errorf("no statement %s", sid)
	}
}
