package resume_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/switchyard/switchyard/core/resume"
)

func Example() {
	// At startup: keys from config, "kid:base64secret".
	k1, err := resume.ParseKey("k1:AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=")
	if err != nil {
		panic(err)
	}
	ring, err := resume.NewKeyring("k1", k1)
	if err != nil {
		panic(err)
	}

	// Sending an event: its SSE id is the token for the position after it.
	now := time.Unix(1_790_000_000, 0)
	pos := resume.Position{
		Stream:     "job-1",
		Generation: 1,
		Seq:        42,
		Snapshot:   1,
		Caller:     resume.Fingerprint("tenant-a", "user-42"),
		Filter:     resume.Fingerprint("stdout"),
	}
	token, err := ring.Sign(pos, now, 10*time.Minute)
	if err != nil {
		panic(err)
	}

	// Resuming: Last-Event-ID comes back; check it against this request.
	want := resume.Expect{Stream: "job-1", Caller: resume.Fingerprint("tenant-a", "user-42"), Filter: resume.Fingerprint("stdout")}
	got, err := ring.Verify(token, now.Add(time.Minute), want)
	if err == nil {
		err = got.Check(1, 1) // the stream's current generation and snapshot
	}
	fmt.Println(got.Seq, err)

	// Another caller presenting the same token: one answer for the client,
	// the reason for the node's logs.
	want.Caller = resume.Fingerprint("tenant-b", "user-7")
	_, err = ring.Verify(token, now.Add(time.Minute), want)
	fmt.Println(errors.Is(err, resume.ErrInvalidToken), resume.ReasonOf(err))
	// Output:
	// 42 <nil>
	// true caller_mismatch
}
