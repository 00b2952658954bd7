package main

import (
	"flag"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Flags come from SWITCHYARD_<FLAG> when not given; the command line wins.
func TestParseFlagsEnvironment(t *testing.T) {
	t.Setenv("SWITCHYARD_HTTP_ADDR", "0.0.0.0:1")
	t.Setenv("SWITCHYARD_DRAIN_TIMEOUT", "7s")
	t.Setenv("SWITCHYARD_NAME", "from-env")
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	cfg, finish := nodeFlags(fs)
	if err := parseFlags(fs, []string{"--name", "from-flag"}); err != nil {
		t.Fatal(err)
	}
	if err := finish(); err != nil {
		t.Fatal(err)
	}
	if cfg.HTTPAddr != "0.0.0.0:1" || cfg.DrainTimeout != 7*time.Second || cfg.Name != "from-flag" {
		t.Fatalf("got http=%s drain=%s name=%s", cfg.HTTPAddr, cfg.DrainTimeout, cfg.Name)
	}
	if cfg.DataDir != "data/from-flag" {
		t.Errorf("data dir %q, want data/<name>", cfg.DataDir)
	}
}

func TestParseFlagsBadEnvironmentNamesTheVariable(t *testing.T) {
	t.Setenv("SWITCHYARD_DRAIN_TIMEOUT", "soon")
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	nodeFlags(fs)
	err := parseFlags(fs, nil)
	if err == nil || !strings.Contains(err.Error(), "SWITCHYARD_DRAIN_TIMEOUT") {
		t.Fatalf("got %v, want an error naming SWITCHYARD_DRAIN_TIMEOUT", err)
	}
}

func TestResumeKeyFlags(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	cfg, finish := nodeFlags(fs)
	key := "k1:" + "MDEyMzQ1Njc4OTAxMjM0NTY3ODkwMTIzNDU2Nzg5MDE="
	if err := parseFlags(fs, []string{"--resume-key", key, "--resume-key", "k2:MDEyMzQ1Njc4OTAxMjM0NTY3ODkwMTIzNDU2Nzg5MDI=", "--resume-signing-key", "k2"}); err != nil {
		t.Fatal(err)
	}
	if err := finish(); err != nil {
		t.Fatal(err)
	}
	if cfg.HTTP.Keyring == nil || cfg.HTTP.Keyring.SigningKeyID() != "k2" {
		t.Fatalf("keyring %v, want signing key k2", cfg.HTTP.Keyring)
	}
	fs = flag.NewFlagSet("t", flag.ContinueOnError)
	_, finish = nodeFlags(fs)
	if err := parseFlags(fs, []string{"--resume-key", "k1:short"}); err != nil {
		t.Fatal(err)
	}
	if err := finish(); err == nil {
		t.Fatal("a short secret was accepted")
	}
}

func TestHTTPWriteBufferFlag(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	cfg, _ := nodeFlags(fs)
	if cfg.HTTP.WriteBuffer <= 0 {
		t.Fatalf("default --http-write-buffer %d: want a cap", cfg.HTTP.WriteBuffer)
	}
	t.Setenv("SWITCHYARD_HTTP_WRITE_BUFFER", "0")
	if err := parseFlags(fs, nil); err != nil {
		t.Fatal(err)
	}
	if cfg.HTTP.WriteBuffer != 0 {
		t.Fatalf("SWITCHYARD_HTTP_WRITE_BUFFER=0 gave %d", cfg.HTTP.WriteBuffer)
	}
}

// A setting a config error names by its flag has that flag.
func TestWorkerSetupTimeoutFlag(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	cfg, _ := nodeFlags(fs)
	if err := parseFlags(fs, []string{"--worker-setup-timeout", "7s"}); err != nil {
		t.Fatal(err)
	}
	if cfg.Workers.SetupTimeout != 7*time.Second {
		t.Fatalf("--worker-setup-timeout 7s gave %v", cfg.Workers.SetupTimeout)
	}
}

// --outputs and --output-bytes make the demo tokens worker's job: that
// many outputs of that many bytes each (a word and its space, the last word
// one byte longer).
func TestBenchInput(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.String("input", "x", "")
	text, err := benchInput(fs, "x", 16, 32)
	if err != nil {
		t.Fatal(err)
	}
	words := strings.Fields(text)
	if len(words) != 16 || len(words[0])+1 != 32 || len(words[15]) != 32 || len(text) != 16*32 {
		t.Fatalf("input of %d words of %d bytes (%d in all), want 16 of 31 and a space, the last of 32", len(words), len(words[0]), len(text))
	}
	if in, err := benchInput(fs, "as given", 0, 32); err != nil || in != "as given" {
		t.Fatalf("without --outputs: %q, %v", in, err)
	}
	if err := fs.Parse([]string{"--input", "y"}); err != nil {
		t.Fatal(err)
	}
	if _, err := benchInput(fs, "y", 16, 32); err == nil {
		t.Fatal("--input with --outputs: no error")
	}
	if _, err := benchInput(flag.NewFlagSet("t", flag.ContinueOnError), "", 16, 1); err == nil {
		t.Fatal("--output-bytes 1: no error")
	}
}

// Secrets come from files: --cluster-secret-file and --etcd-password-file
// (or their SWITCHYARD_ variables, which name the file), trimmed; a secret
// given both ways, or an empty file, is refused.
func TestSecretFiles(t *testing.T) {
	dir := t.TempDir()
	secret, password := dir+"/secret", dir+"/password"
	if err := os.WriteFile(secret, []byte("a-cluster-secret-of-16+\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(password, []byte("etcd-pass\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SWITCHYARD_ETCD_PASSWORD_FILE", password)
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	cfg, finish := nodeFlags(fs)
	if err := parseFlags(fs, []string{"--cluster-secret-file", secret, "--etcd-username", "switchyard"}); err != nil {
		t.Fatal(err)
	}
	if err := finish(); err != nil {
		t.Fatal(err)
	}
	if cfg.ClusterSecret != "a-cluster-secret-of-16+" || cfg.EtcdPassword != "etcd-pass" {
		t.Fatalf("secret %q, password %q", cfg.ClusterSecret, cfg.EtcdPassword)
	}

	empty := dir + "/empty"
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"--cluster-secret-file", secret, "--cluster-secret", "another-secret-of-16+"},
		{"--cluster-secret-file", empty},
		{"--cluster-secret-file", dir + "/missing"},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		_, finish := nodeFlags(fs)
		if err := parseFlags(fs, args); err != nil {
			t.Fatal(err)
		}
		if err := finish(); err == nil || !strings.Contains(err.Error(), "cluster-secret") {
			t.Errorf("%v: %v, want a refusal naming --cluster-secret", args, err)
		}
	}
}
