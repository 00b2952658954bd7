package resume_test

import (
	"github.com/switchyard/switchyard/core/resume"

	"strings"
	"testing"
	"time"
)

func BenchmarkSign(b *testing.B) {
	kr := MustKeyring(b, "k1", testKey("k1", 1))
	p := samplePosition()
	var tok string
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		p.Seq = uint64(i)
		tok, _ = kr.Sign(p, t0, 10*time.Minute)
	}
	b.ReportMetric(float64(len(tok)), "token_bytes")
}

func BenchmarkVerify(b *testing.B) {
	kr := MustKeyring(b, "k1", testKey("k1", 1), testKey("k0", 2))
	p := samplePosition()
	want := expectFor(p)
	tok := MustSign(b, kr, p, t0, 10*time.Minute)
	kid, payload, mac := segments(b, tok)
	cases := []struct {
		name  string
		token string
	}{
		{"valid", tok},
		// What rejecting garbage costs: the cheap checks come first.
		{"oversized", strings.Repeat("A", 64<<10)},
		{"unknown_key", "zz." + payload + "." + mac},
		{"bad_signature", kid + "." + flip(payload, 5) + "." + mac},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_, _ = kr.Verify(c.token, t0, want)
			}
			b.ReportMetric(float64(len(c.token)), "token_bytes")
		})
	}
}

// BenchmarkAppendSign is what a stream's writer pays per event: a Signer
// made once per stream, each token appended to a buffer it reuses.
func BenchmarkAppendSign(b *testing.B) {
	kr := MustKeyring(b, "k1", testKey("k1", 1))
	p := samplePosition()
	s, err := kr.Signer(p.Stream, p.Snapshot, p.Caller, p.Filter, 10*time.Minute)
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 0, resume.MaxTokenLen)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		buf, _ = s.AppendSign(buf[:0], p.Generation, uint64(i), t0)
	}
	b.ReportMetric(float64(len(buf)), "token_bytes")
}
