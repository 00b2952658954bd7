package resume_test

import (
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
