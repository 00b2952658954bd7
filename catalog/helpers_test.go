package catalog_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/switchyard/switchyard/catalog"
)

// testLogger writes the catalog's logs, debug included, to the test's
// output, where they show with -v or when the test fails.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// testSecret is the cluster secret of the tests' catalogs: an embedded
// member derives its TLS from it, a client of one its certificate.
var testSecret = []byte("catalog-test-cluster-secret")

// open opens a catalog (with testSecret unless cfg has a secret) and
// closes it when the test ends.
func open(t *testing.T, cfg catalog.Config) *catalog.Catalog {
	t.Helper()
	if cfg.Secret == nil {
		cfg.Secret = testSecret
	}
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t).With("node", cfg.Name)
	}
	c := openPlain(t, cfg)
	t.Cleanup(func() {
		if err := c.Close(context.Background()); err != nil {
			t.Errorf("Close(%s): %v", cfg.Name, err)
		}
	})
	return c
}

// openPlain opens a catalog on cfg as given, within 30s, and logs how long
// Open took; the caller closes it (a cluster's member: the cluster's
// cleanup). A member's restart on its data directory opens it so.
func openPlain(t *testing.T, cfg catalog.Config) *catalog.Catalog {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	c, err := catalog.Open(ctx, cfg)
	if err != nil {
		t.Fatalf("Open(%s): %v", cfg.Name, err)
	}
	t.Logf("Open(%s) took %v", cfg.Name, time.Since(start).Round(time.Millisecond))
	return c
}

// embeddedConfig is a fast, test-only embedded configuration.
func embeddedConfig(t *testing.T, name string) catalog.Config {
	return catalog.Config{
		Name:          name,
		Dir:           t.TempDir(),
		FastElection:  true,
		UnsafeNoFsync: true,
		LeaseTTL:      2 * time.Second,
		Secret:        testSecret,
	}
}

// eventually polls cond until it holds or within passes, and returns how
// long it took.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > within {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(2 * time.Millisecond)
	}
	return time.Since(start)
}

// proxy is a TCP proxy whose Cut drops every connection and refuses new
// ones: a partition between a client and its etcd, without stopping etcd.
type proxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	conns   []net.Conn
	cut     bool
	blocked bool
	wg      sync.WaitGroup
}

func startProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy listen: %v", err)
	}
	p := &proxy{ln: ln, target: target}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Cut)
	return p
}

func (p *proxy) Addr() string { return p.ln.Addr().String() }

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		blocked := p.blocked
		p.mu.Unlock()
		if blocked {
			in.Close()
			continue
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			in.Close()
			continue
		}
		p.mu.Lock()
		if p.cut || p.blocked {
			p.mu.Unlock()
			in.Close()
			out.Close()
			continue
		}
		p.conns = append(p.conns, in, out)
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(in, out)
		go p.pipe(out, in)
	}
}

func (p *proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	_, _ = io.Copy(dst, src)
	dst.Close()
	src.Close()
}

// Block drops every connection and closes new ones at once until Unblock.
func (p *proxy) Block() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.blocked = true
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// Unblock lets connections through again.
func (p *proxy) Unblock() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.blocked = false
}

// Cut closes the listener and every connection and waits for the proxy's
// goroutines. It is idempotent.
func (p *proxy) Cut() {
	p.mu.Lock()
	if !p.cut {
		p.cut = true
		p.ln.Close()
		for _, c := range p.conns {
			c.Close()
		}
	}
	p.mu.Unlock()
	p.wg.Wait()
}
