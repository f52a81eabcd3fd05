package main

import (
	"net"
	"path/filepath"
	"strings"
	"testing"

	sluiceddb "github.com/sluice-rl/sluice/backend/dynamodb"
	"github.com/sluice-rl/sluice/backend/dynamodb/dynamodbtest"
)

// TestMain shares one DynamoDB Local among the package's tests. It starts
// on the first dynamodbtest.Require only, so without Java the other tests
// run as before and only the DynamoDB ones skip (fail with CI=true).
func TestMain(m *testing.M) { dynamodbtest.Main(m) }

// awsEnv isolates the AWS SDK from the developer's environment: dummy
// credentials (DynamoDB Local takes any), no shared config or profile,
// one attempt per call.
func awsEnv(t *testing.T) {
	dir := t.TempDir()
	for k, v := range map[string]string{
		"AWS_ACCESS_KEY_ID":           "local",
		"AWS_SECRET_ACCESS_KEY":       "local",
		"AWS_SESSION_TOKEN":           "",
		"AWS_PROFILE":                 "",
		"AWS_CONFIG_FILE":             filepath.Join(dir, "config"),
		"AWS_SHARED_CREDENTIALS_FILE": filepath.Join(dir, "credentials"),
		"AWS_REGION":                  "",
		"AWS_DEFAULT_REGION":          "",
		"AWS_ENDPOINT_URL":            "",
		"AWS_ENDPOINT_URL_DYNAMODB":   "",
		"AWS_MAX_ATTEMPTS":            "1",
		"AWS_EC2_METADATA_DISABLED":   "true",
		"SLUICE_TABLE":                "",
		"SLUICE_REGION":               "",
		"SLUICE_ENDPOINT":             "",
	} {
		t.Setenv(k, v)
	}
}

func TestTableCreate(t *testing.T) {
	srv := dynamodbtest.Require(t)
	awsEnv(t)
	name := dynamodbtest.TableName(t)

	out, code := sluice(t, "table", "create", "--table", name, "--region", "us-east-1", "--endpoint", srv.Endpoint())
	if want := "created table " + name + "\nTTL is enabled on attribute ttl\n"; code != 0 || out != want {
		t.Fatalf("first create: exit %d\n%s\nwant exit 0\n%s", code, out, want)
	}
	if err := sluiceddb.CheckTable(t.Context(), srv.Client(t.Context()), name); err != nil {
		t.Fatalf("CheckTable after create: %v", err)
	}

	// Again, every flag from its environment variable.
	t.Setenv("SLUICE_TABLE", name)
	t.Setenv("SLUICE_REGION", "us-east-1")
	t.Setenv("SLUICE_ENDPOINT", srv.Endpoint())
	out, code = sluice(t, "table", "create")
	if want := "table " + name + " already exists\nTTL is enabled on attribute ttl\n"; code != 0 || out != want {
		t.Fatalf("second create: exit %d\n%s\nwant exit 0\n%s", code, out, want)
	}
}

func TestTableCreateUsage(t *testing.T) {
	awsEnv(t)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"table", "create"}, 2, "--table (or SLUICE_TABLE) is required"},
		{[]string{"table", "create", "--table", "t", "--region", "us-east-1", "--endpoint", "localhost:8000"}, 2, `--endpoint "localhost:8000": want a URL`},
		{[]string{"table", "create", "--table", "t"}, 2, "no AWS region: set --region (SLUICE_REGION) or AWS_REGION"},
		{[]string{"table", "create", "--table", "t", "extra"}, 2, `unknown command "extra"`},
		{[]string{"table", "create", "--tabel", "t"}, 2, "unknown flag: --tabel"},
		{[]string{"table", "drop"}, 2, `unknown command "drop" for "sluice table"`},
		{[]string{"table", "create", "--help"}, 0, "sluice table create --table sluice --region us-east-1 --endpoint http://localhost:8000"},
		{[]string{"table"}, 0, "create      Create the DynamoDB table"},
	} {
		out, code := sluice(t, tc.args...)
		if code != tc.code || !strings.Contains(out, tc.want) {
			t.Errorf("sluice %s: exit %d\n%s\nwant exit %d and %q", strings.Join(tc.args, " "), code, out, tc.code, tc.want)
		}
	}
}

// DynamoDB unreachable: exit 1, and the error says what was being done.
func TestTableCreateFailure(t *testing.T) {
	awsEnv(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	endpoint := "http://" + ln.Addr().String()
	ln.Close() // nothing listens there now
	out, code := sluice(t, "table", "create", "--table", "t1", "--region", "us-east-1", "--endpoint", endpoint)
	if code != 1 || !strings.Contains(out, `sluice: create table "t1"`) || !strings.Contains(out, "connection refused") {
		t.Fatalf("exit %d\n%s\nwant exit 1 and the cause", code, out)
	}
}
