package resume_test

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/switchyard/switchyard/core/resume"
)

// A Signer's tokens, and AppendSign's, are byte for byte Sign's, and verify.
func TestSignerMatchesSign(t *testing.T) {
	kr := MustKeyring(t, "k1", testKey("k1", 1), testKey("k0", 2))
	r := rand.New(rand.NewPCG(1, 2))
	for range 500 {
		p := samplePosition()
		p.Stream = strings.Repeat("j", 1+r.IntN(resume.MaxStreamLen))
		p.Generation, p.Seq, p.Snapshot = r.Uint64()>>r.IntN(64), r.Uint64()>>r.IntN(64), r.Uint64()>>r.IntN(64)
		ttl := time.Duration(1+r.IntN(int(resume.MaxTTL/time.Second))) * time.Second
		now := t0.Add(time.Duration(r.IntN(1e6)) * time.Second)
		want := MustSign(t, kr, p, now, ttl)

		s, err := kr.Signer(p.Stream, p.Snapshot, p.Caller, p.Filter, ttl)
		if err != nil {
			t.Fatal(err)
		}
		prefix := []byte("id: ")
		got, err := s.AppendSign(prefix, p.Generation, p.Seq, now)
		if err != nil || string(got) != "id: "+want {
			t.Fatalf("Signer.AppendSign = %q, %v; want %q", got, err, "id: "+want)
		}
		got, err = kr.AppendSign(nil, p, now, ttl)
		if err != nil || string(got) != want {
			t.Fatalf("Keyring.AppendSign = %q, %v; want %q", got, err, want)
		}
		if _, err := kr.Verify(want, now, expectFor(p)); err != nil {
			t.Fatalf("Verify: %v", err)
		}
	}
}

// A Signer refuses what Sign refuses, and AppendSign then leaves dst as it
// was.
func TestSignerRefuses(t *testing.T) {
	kr := MustKeyring(t, "k1", testKey("k1", 1))
	p := samplePosition()
	for _, c := range []struct {
		stream string
		ttl    time.Duration
	}{{"", time.Minute}, {strings.Repeat("j", resume.MaxStreamLen+1), time.Minute}, {"j", time.Second / 2}, {"j", resume.MaxTTL + time.Second}} {
		if _, err := kr.Signer(c.stream, 1, p.Caller, p.Filter, c.ttl); !errors.Is(err, resume.ErrUnsignable) {
			t.Errorf("Signer(%q, %v): %v, want ErrUnsignable", c.stream, c.ttl, err)
		}
	}
	s, err := kr.Signer(p.Stream, p.Snapshot, p.Caller, p.Filter, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	dst := []byte("keep")
	if got, err := s.AppendSign(dst, 1, 1, time.Unix(-1, 0)); !errors.Is(err, resume.ErrUnsignable) || string(got) != "keep" {
		t.Errorf("AppendSign before 1970 = %q, %v; want dst unchanged and ErrUnsignable", got, err)
	}
	var zero resume.Signer
	if got, err := zero.AppendSign(dst, 1, 1, t0); !errors.Is(err, resume.ErrUnsignable) || string(got) != "keep" {
		t.Errorf("zero Signer = %q, %v; want dst unchanged and ErrUnsignable", got, err)
	}
}

// Signing an event costs no allocation: the token goes straight into the
// writer's buffer.
func TestSignerAllocs(t *testing.T) {
	if raceDetector {
		t.Skip("-race allocates where a plain build does not")
	}
	kr := MustKeyring(t, "k1", testKey("k1", 1))
	p := samplePosition()
	s, err := kr.Signer(p.Stream, p.Snapshot, p.Caller, p.Filter, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 0, resume.MaxTokenLen)
	seq := uint64(0)
	if n := testing.AllocsPerRun(1000, func() {
		seq++
		buf, _ = s.AppendSign(buf[:0], p.Generation, seq, t0)
	}); n != 0 {
		t.Errorf("Signer.AppendSign: %v allocations per token, want 0", n)
	}
	if n := testing.AllocsPerRun(1000, func() {
		seq++
		p.Seq = seq
		buf, _ = kr.AppendSign(buf[:0], p, t0, time.Hour)
	}); n != 0 {
		t.Errorf("Keyring.AppendSign: %v allocations per token, want 0", n)
	}
}
