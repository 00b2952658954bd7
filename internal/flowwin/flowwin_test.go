package flowwin

import "testing"

func TestWindows(t *testing.T) {
	for _, tc := range []struct {
		maxMessage   int
		stream, conn int32
	}{
		{0, 4 << 20, 16 << 20},         // the SDK's: no largest message known
		{1 << 20, 4 << 20, 16 << 20},   // below the floor
		{16 << 20, 16 << 20, 64 << 20}, // one largest message a stream
		{1 << 31, 1 << 30, 1 << 30},    // HTTP/2's bound (2^31-1), rounded down
	} {
		s, c := Windows(tc.maxMessage)
		if s != tc.stream || c != tc.conn {
			t.Errorf("Windows(%d) = %d, %d; want %d, %d", tc.maxMessage, s, c, tc.stream, tc.conn)
		}
	}
}
