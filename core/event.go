package core

import (
	"bytes"
	"encoding/json"
)

// This file encodes the data of the events the ingress appends to a job's
// history: an output's once per event on the hot path, without
// reflection; the rare ones (accepted, done, error) with encoding/json.

// outputEvent is an output event's data, {"data":<output>}: the bytes
// json.Marshal would make of it (compacted, with <, >, &, U+2028 and
// U+2029 escaped), built without reflection or a map, once per output. n
// is the size of the output compacted; ok is false when the output is not
// one JSON value (json.Compact validates as json.Valid does). Compacting
// keeps a worker's newlines out of SSE data.
func outputEvent(output []byte) (ev []byte, n int, ok bool) {
	const head = `{"data":`
	var buf bytes.Buffer
	buf.Grow(len(head) + len(output) + 1)
	buf.WriteString(head)
	if s := trimJSONSpace(output); len(s) >= 2 && s[0] == '"' && validJSONString(s) {
		// One string, the usual output (a token, a chunk of text): it is
		// its own compact form, checked in one pass instead of
		// json.Compact's state machine (several times slower per byte).
		buf.Write(s)
	} else if json.Compact(&buf, output) != nil {
		return nil, 0, false
	}
	n = buf.Len() - len(head)
	if needsHTMLEscape(buf.Bytes()[len(head):]) {
		var esc bytes.Buffer
		esc.Grow(buf.Len() + 16)
		esc.WriteString(head)
		json.HTMLEscape(&esc, buf.Bytes()[len(head):])
		buf = esc
	}
	buf.WriteByte('}')
	return buf.Bytes(), n, true
}

// trimJSONSpace trims JSON's insignificant whitespace (space, tab, CR, LF)
// from both ends of b.
func trimJSONSpace(b []byte) []byte {
	isSpace := func(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }
	for len(b) > 0 && isSpace(b[0]) {
		b = b[1:]
	}
	for len(b) > 0 && isSpace(b[len(b)-1]) {
		b = b[:len(b)-1]
	}
	return b
}

// validJSONString reports whether s, which starts with a quote, is one
// JSON string and nothing else, as json.Compact judges it: no control
// character, only JSON's escapes, no unescaped quote before the last byte.
// Like json.Compact it does not check UTF-8.
func validJSONString(s []byte) bool {
	end := len(s) - 1
	if end < 1 || s[end] != '"' {
		return false
	}
	for i := 1; i < end; i++ {
		switch c := s[i]; {
		case c < 0x20, c == '"':
			return false
		case c == '\\':
			i++
			if i >= end {
				return false // the escape would take the closing quote
			}
			switch s[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if i+4 >= end {
					return false
				}
				for _, h := range s[i+1 : i+5] {
					if !('0' <= h && h <= '9' || 'a' <= h && h <= 'f' || 'A' <= h && h <= 'F') {
						return false
					}
				}
				i += 4
			default:
				return false
			}
		}
	}
	return true
}

// needsHTMLEscape reports whether b may hold what json.HTMLEscape
// rewrites: <, >, & or the lead byte of U+2028 and U+2029. Four
// vectorised scans beat one loop over the bytes on outputs of a few KiB.
func needsHTMLEscape(b []byte) bool {
	return bytes.IndexByte(b, '<') >= 0 || bytes.IndexByte(b, '>') >= 0 ||
		bytes.IndexByte(b, '&') >= 0 || bytes.IndexByte(b, 0xE2) >= 0
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic("core: marshal event: " + err.Error())
	}
	return b
}
