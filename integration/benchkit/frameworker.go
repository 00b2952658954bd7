package benchkit

import (
	"context"
	"encoding/json"
	"fmt"

	"google.golang.org/protobuf/types/known/wrapperspb"
)

// RunFrameWorker is the opaque relay floor's worker at its cheapest: it
// attaches to the FrameNode at node and answers every job at once, from its
// receive loop, with the frames of the job's shape: BareShape's Outputs
// frames of Bytes bytes of text each, the last flagged frameLast. The shape
// is read from the job's payload, a job envelope whose "options" hold a
// BareShape (16 × 32 B when absent or unreadable); the frames of each
// distinct payload are encoded once, so a job costs a map lookup (which
// hashes the payload), then per frame a copy with the job id patched in and
// a send. It returns when ctx ends or the stream breaks.
//
// It is the floor the Go worker SDK is measured against in
// BenchmarkProcesses: a worker end that does nothing but answer.
func RunFrameWorker(ctx context.Context, node string) error {
	st, stop, err := dialRaw(ctx, node, &frameDesc.Streams[1], frameAttach)
	if err != nil {
		return err
	}
	defer stop()
	// NewStream sends the stream's headers: the node sees the worker
	// attached without a message from it.
	answers := map[string][]encodedFrame{}
	for {
		m := new(wrapperspb.BytesValue)
		if err := st.RecvMsg(m); err != nil {
			return err
		}
		h, payload, ok := readFrame(m)
		if !ok {
			return fmt.Errorf("frame worker: short frame")
		}
		frames := answers[string(payload)]
		if frames == nil {
			if len(answers) >= 64 {
				clear(answers) // bound the cache: a bench uses a few shapes
			}
			frames = shapeFrames(payload)
			answers[string(payload)] = frames
		}
		for _, f := range frames {
			if err := st.SendMsg(f.forJob(h.id)); err != nil {
				return err
			}
		}
	}
}

// shapeFrames encodes the answers to a job whose envelope is payload.
func shapeFrames(payload []byte) []encodedFrame {
	var env struct {
		Options BareShape `json:"options"`
	}
	env.Options = BareShape{Outputs: 16, Bytes: 32}
	if json.Unmarshal(payload, &env) != nil || env.Options.Outputs < 1 {
		env.Options = BareShape{Outputs: 16, Bytes: 32}
	}
	s := env.Options
	text := make([]byte, max(s.Bytes, 0))
	for i := range text {
		text[i] = 'a' + byte(i%26)
	}
	frames := make([]encodedFrame, s.Outputs)
	for i := range frames {
		var flags byte
		if i == len(frames)-1 {
			flags = frameLast
		}
		frames[i] = encodeFrame(frameHeader{seq: uint16(i), flags: flags}, text)
	}
	return frames
}
