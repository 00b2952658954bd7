package core

import (
	"bytes"
	"encoding/json"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"

	"github.com/go-json-experiment/json/jsontext"
)

// This file encodes the data of the events the ingress appends to a job's
// history: an output's once per event on the hot path, without
// reflection; a job's accepted and terminal events once per job, by hand
// when their strings need no escaping, else with encoding/json.

// outputEvent is an output event's data, {"data":<output>}: the bytes
// json.Marshal would make of it (compacted, with <, >, &, U+2028 and
// U+2029 escaped), built without reflection or a map, once per output. n
// is the size of the output compacted; ok is false when the output is not
// one strict JSON value (strictjson.go: valid UTF-8, no lone surrogate
// escape, no member named twice). Compacting keeps a worker's newlines
// out of SSE data.
func outputEvent(output []byte) (ev []byte, n int, ok bool) {
	return appendOutputEvent(nil, output)
}

// outputEventMax is the most outputEvent makes of output without HTML
// escapes: its own size and the object around it.
func outputEventMax(output []byte) int { return len(`{"data":}`) + len(output) }

// appendOutputEvent is outputEvent, built in buf's spare capacity (buf is
// empty) when it holds outputEventMax(output) bytes, as it does but when
// the output needs HTML escapes; else in an array of its own. Either way
// it writes nothing of buf before its length, nor past its capacity.
func appendOutputEvent(buf, output []byte) (ev []byte, n int, ok bool) {
	const head = `{"data":`
	if cap(buf) < outputEventMax(output) {
		buf = make([]byte, 0, outputEventMax(output))
	}
	buf = append(buf[:0], head...)
	if s := trimJSONSpace(output); len(s) >= 2 && s[0] == '"' && validJSONString(s) {
		// One string, the usual output (a token, a chunk of text): it is
		// its own compact form, checked in one pass instead of the
		// tokenizer's (several times slower per byte).
		buf = append(buf, s...)
	} else {
		// Compacted in place, in the copy: never longer than the output.
		v := jsontext.Value(append(buf, output...)[len(head):])
		if v.Compact(strictJSON...) != nil {
			return nil, 0, false
		}
		buf = buf[:len(head)+len(v)]
	}
	n = len(buf) - len(head)
	if needsHTMLEscape(buf[len(head):]) {
		var esc bytes.Buffer
		esc.Grow(len(buf) + 16)
		esc.WriteString(head)
		json.HTMLEscape(&esc, buf[len(head):])
		buf = esc.Bytes()
	}
	return append(buf, '}'), n, true
}

// eventSlab carves the data of a running job's output events out of
// arrays each shared by several events, instead of one allocation per
// event (most outputs are a few dozen bytes). Event data is read-only
// once appended (stream writers share it): a slab hands out the bytes
// past what it handed out before, never those again, and each event's
// data is capped at its length, so nothing appends into its neighbour.
// Arrays grow from slabFirst to slabMax as the job produces; an output
// larger than a quarter of slabMax gets an array of its own, so what a
// retained event keeps alive beyond its own bytes is bounded. A job drops
// its slab when it ends (its history is compacted into one buffer then).
// The zero value is ready; guarded by Engine.mu.
type eventSlab struct {
	free []byte
	size int
}

const (
	slabFirst = 512
	slabMax   = 8 << 10
)

// take is an empty buffer with room for n bytes: the slab's free space,
// or a new array of the next size, or of n if larger.
func (s *eventSlab) take(n int) []byte {
	if cap(s.free) < n {
		if n > slabMax/4 {
			return make([]byte, 0, n)
		}
		s.size = min(max(2*s.size, slabFirst), slabMax)
		s.free = make([]byte, 0, max(s.size, n))
	}
	return s.free[:0:n]
}

// keep is the event data b, built in what take returned, capped at its
// length; the slab goes on past it. Data its builder put in an array of
// its own is not the slab's and leaves it as it was.
func (s *eventSlab) keep(b []byte) []byte {
	if len(b) > 0 && len(b) <= cap(s.free) && unsafe.SliceData(b) == unsafe.SliceData(s.free) {
		s.free = s.free[len(b):len(b)]
	}
	return b[:len(b):len(b)]
}

// strictJSON are the options that make jsontext's Compact, which by
// default lets duplicate names and invalid UTF-8 through, hold a value to
// the strict rules (its validating default elsewhere).
var strictJSON = []jsontext.Options{jsontext.AllowDuplicateNames(false), jsontext.AllowInvalidUTF8(false)}

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
// strict JSON string and nothing else: no control character, only JSON's
// escapes, no unescaped quote before the last byte, valid UTF-8, and every
// \u escape of a surrogate one half of a pair (high, then low).
func validJSONString(s []byte) bool {
	end := len(s) - 1
	if end < 1 || s[end] != '"' {
		return false
	}
	for i := 1; i < end; i++ {
		c := s[i]
		if plainASCII[c] {
			continue
		}
		switch {
		case c < 0x20, c == '"':
			return false
		case c >= utf8.RuneSelf:
			// A run of non-ASCII bytes holds whole UTF-8 sequences, if it
			// is valid: one utf8.Valid over the run.
			j := i + 1
			for j < end && s[j] >= utf8.RuneSelf {
				j++
			}
			if !utf8.Valid(s[i:j]) {
				return false
			}
			i = j - 1
		case c == '\\':
			i++
			if i >= end {
				return false // the escape would take the closing quote
			}
			switch s[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				u, ok := hex4(s[i+1 : end])
				if !ok {
					return false
				}
				i += 4
				if !utf16.IsSurrogate(rune(u)) {
					continue
				}
				// A high surrogate must be followed by \u and a low one.
				if u >= 0xDC00 || i+2 >= end || s[i+1] != '\\' || s[i+2] != 'u' {
					return false
				}
				lo, ok := hex4(s[i+3 : end])
				if !ok || lo < 0xDC00 || lo > 0xDFFF {
					return false
				}
				i += 6
			default:
				return false
			}
		}
	}
	return true
}

// plainASCII marks the bytes a JSON string holds as they are: ASCII but
// the control characters, the quote and the backslash.
var plainASCII = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// hex4 reads the four hex digits b starts with.
func hex4(b []byte) (uint16, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var u uint16
	for _, h := range b[:4] {
		switch {
		case '0' <= h && h <= '9':
			h -= '0'
		case 'a' <= h && h <= 'f':
			h -= 'a' - 10
		case 'A' <= h && h <= 'F':
			h -= 'A' - 10
		default:
			return 0, false
		}
		u = u<<4 | uint16(h)
	}
	return u, true
}

// needsHTMLEscape reports whether b may hold what json.HTMLEscape
// rewrites: <, >, & or the lead byte of U+2028 and U+2029. Four
// vectorised scans beat one loop over the bytes on outputs of a few KiB.
func needsHTMLEscape(b []byte) bool {
	return bytes.IndexByte(b, '<') >= 0 || bytes.IndexByte(b, '>') >= 0 ||
		bytes.IndexByte(b, '&') >= 0 || bytes.IndexByte(b, 0xE2) >= 0
}

// The data of the events the engine writes itself. They are structs, not
// maps, so that encoding one takes no map, no key sort and no reflection
// over a map per job; their fields are in the order encoding/json gives a
// map's keys (sorted), so the bytes are those a map of the same entries
// encodes to (TestEventDataMatchesMaps).
type (
	acceptedData struct {
		Queue   string `json:"queue"`
		TraceID string `json:"trace_id"`
		TTLMs   int64  `json:"ttl_ms"`
	}
	// doneData is a completed job's; Result is left out when nil, as the
	// map left the key out.
	doneData struct {
		Outcome Outcome         `json:"outcome"`
		Result  json.RawMessage `json:"result,omitempty"`
	}
	errorData struct {
		Code    Code    `json:"code"`
		Detail  string  `json:"detail"`
		Outcome Outcome `json:"outcome"`
	}
)

// plainJSON reports whether s is its own JSON string body: printable
// ASCII with nothing encoding/json escapes (a quote, a backslash, <, >,
// &).
func plainJSON(s string) bool {
	for i := range len(s) {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// appendPlain appends `"key":"s"` (s plain: plainJSON).
func appendPlain(b []byte, key, s string) []byte {
	b = append(b, '"')
	b = append(b, key...)
	b = append(b, `":"`...)
	b = append(b, s...)
	return append(b, '"')
}

// encode is d's JSON: mustJSON(d)'s bytes.
func (d acceptedData) encode() []byte {
	if !plainJSON(d.Queue) || !plainJSON(d.TraceID) {
		return mustJSON(d)
	}
	b := make([]byte, 0, len(`{"queue":"","trace_id":"","ttl_ms":-9223372036854775808}`)+len(d.Queue)+len(d.TraceID))
	b = appendPlain(append(b, '{'), "queue", d.Queue)
	b = appendPlain(append(b, ','), "trace_id", d.TraceID)
	b = strconv.AppendInt(append(b, `,"ttl_ms":`...), d.TTLMs, 10)
	return append(b, '}')
}

// encode is d's JSON: mustJSON(d)'s bytes. A result is compacted, as
// encoding/json compacts a RawMessage; one that holds what it would
// escape for HTML goes through encoding/json.
func (d doneData) encode() []byte {
	if !plainJSON(string(d.Outcome)) || needsHTMLEscape(d.Result) {
		return mustJSON(d)
	}
	b := make([]byte, 0, len(`{"outcome":"","result":}`)+len(d.Outcome)+len(d.Result))
	b = appendPlain(append(b, '{'), "outcome", string(d.Outcome))
	if len(d.Result) == 0 {
		return append(b, '}')
	}
	buf := bytes.NewBuffer(append(b, `,"result":`...))
	if json.Compact(buf, d.Result) != nil {
		return mustJSON(d)
	}
	buf.WriteByte('}')
	return buf.Bytes()
}

// encode is d's JSON: mustJSON(d)'s bytes.
func (d errorData) encode() []byte {
	if !plainJSON(string(d.Code)) || !plainJSON(d.Detail) || !plainJSON(string(d.Outcome)) {
		return mustJSON(d)
	}
	b := make([]byte, 0, len(`{"code":"","detail":"","outcome":""}`)+len(d.Code)+len(d.Detail)+len(d.Outcome))
	b = appendPlain(append(b, '{'), "code", string(d.Code))
	b = appendPlain(append(b, ','), "detail", d.Detail)
	b = appendPlain(append(b, ','), "outcome", string(d.Outcome))
	return append(b, '}')
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic("core: marshal event: " + err.Error())
	}
	return b
}
