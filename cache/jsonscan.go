package cache

import (
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"
)

// This file reads the few fields the cache needs from an object's JSON in
// one validating pass, without building maps or copying what it skips:
// encoding/json would scan each object several times and allocate for every
// field it touched, and stripping managedFields would re-encode the whole
// object. The grammar is RFC 8259's, as strict as encoding/json's (the
// fuzz test FuzzDecodeObject holds it to that).

// errTruncated says the input ended inside a JSON value.
var errTruncated = errors.New("unexpected end of JSON input")

// maxDepth bounds nesting, as encoding/json does.
const maxDepth = 10000

// scanner walks one JSON text.
type scanner struct {
	b []byte
	i int
}

func (s *scanner) errorf(format string, args ...any) error {
	return fmt.Errorf("invalid JSON at offset %d: %s", s.i, fmt.Sprintf(format, args...))
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// eof is what peek returns at the end of the input.
const eof = -1

// peek returns the next non-space byte, or eof.
func (s *scanner) peek() int {
	s.ws()
	if s.i >= len(s.b) {
		return eof
	}
	return int(s.b[s.i])
}

// expect consumes byte c after optional space.
func (s *scanner) expect(c byte) error {
	switch s.peek() {
	case int(c):
		s.i++
		return nil
	case eof:
		return errTruncated
	}
	return s.errorf("want %q, have %q", c, s.b[s.i])
}

// str consumes a string and returns its raw contents (between the quotes)
// and whether they hold an escape.
func (s *scanner) str() (raw []byte, escaped bool, err error) {
	if err := s.expect('"'); err != nil {
		return nil, false, err
	}
	start := s.i
	for s.i < len(s.b) {
		c := s.b[s.i]
		if plain[c] {
			s.i++
			continue
		}
		switch {
		case c == '"':
			s.i++
			return s.b[start : s.i-1], escaped, nil
		case c == '\\':
			escaped = true
			if s.i+1 >= len(s.b) {
				return nil, false, errTruncated
			}
			switch s.b[s.i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.i += 2
			case 'u':
				if s.i+6 > len(s.b) {
					return nil, false, errTruncated
				}
				for _, h := range s.b[s.i+2 : s.i+6] {
					if !isHex(h) {
						return nil, false, s.errorf("bad \\u escape")
					}
				}
				s.i += 6
			default:
				return nil, false, s.errorf("bad escape")
			}
		case c < 0x20:
			return nil, false, s.errorf("control character in string")
		default:
			s.i++
		}
	}
	return nil, false, errTruncated
}

// plain marks the bytes that stand for themselves in a JSON string.
var plain = func() (t [256]bool) {
	for c := 0x20; c < 256; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

func isHex(c byte) bool { return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F' }

// text consumes a string and returns it decoded.
func (s *scanner) text() (string, error) {
	start := s.i
	raw, escaped, err := s.str()
	if err != nil {
		return "", err
	}
	if !escaped && utf8.Valid(raw) {
		return string(raw), nil
	}
	var v string // escapes and invalid UTF-8, as encoding/json reads them
	if err := json.Unmarshal(s.b[start:s.i], &v); err != nil {
		return "", err
	}
	return v, nil
}

// member consumes an object key and its colon, and returns the index of
// the key in names, or -1.
func (s *scanner) member(names ...string) (int, error) {
	s.ws()
	start := s.i
	raw, escaped, err := s.str()
	if err != nil {
		return 0, err
	}
	if err := s.expect(':'); err != nil {
		return 0, err
	}
	if !escaped {
		for i, n := range names {
			if string(raw) == n { // compared in place: no allocation
				return i, nil
			}
		}
		return -1, nil
	}
	var k string
	if err := json.Unmarshal(s.b[start:start+len(raw)+2], &k); err != nil {
		return 0, err
	}
	for i, n := range names {
		if k == n {
			return i, nil
		}
	}
	return -1, nil
}

// fields calls field for each member of an object, which must consume the
// member's value. The scanner is at the key when field is called.
func (s *scanner) fields(field func() error) error {
	if err := s.expect('{'); err != nil {
		return err
	}
	if s.peek() == '}' {
		s.i++
		return nil
	}
	for {
		if s.peek() != '"' {
			if s.i >= len(s.b) {
				return errTruncated
			}
			return s.errorf("want an object key")
		}
		if err := field(); err != nil {
			return err
		}
		switch s.peek() {
		case ',':
			s.i++
		case '}':
			s.i++
			return nil
		case eof:
			return errTruncated
		default:
			return s.errorf("want ',' or '}' in object")
		}
	}
}

// skip consumes one value of any kind, validating it, iteratively.
func (s *scanner) skip() error {
	// stack holds the open containers: '{' or '['.
	var inline [64]byte
	stack := inline[:0]
	for {
		switch c := s.peek(); c {
		case eof:
			return errTruncated
		case '{', '[':
			if len(stack) >= maxDepth {
				return s.errorf("nested too deeply")
			}
			stack = append(stack, byte(c))
			s.i++
			closer := int('}')
			if c == '[' {
				closer = ']'
			}
			if s.peek() == closer {
				s.i++
				stack = stack[:len(stack)-1]
				break
			}
			if c == '{' {
				if _, _, err := s.str(); err != nil {
					return err
				}
				if err := s.expect(':'); err != nil {
					return err
				}
			}
			continue
		case '"':
			if _, _, err := s.str(); err != nil {
				return err
			}
		case 't':
			if err := s.literal("true"); err != nil {
				return err
			}
		case 'f':
			if err := s.literal("false"); err != nil {
				return err
			}
		case 'n':
			if err := s.literal("null"); err != nil {
				return err
			}
		default:
			if err := s.number(); err != nil {
				return err
			}
		}
		// A value ended: close containers, or go on to the next member.
		for {
			if len(stack) == 0 {
				return nil
			}
			top := stack[len(stack)-1]
			c := s.peek()
			switch {
			case c == ',':
				s.i++
				if top == '{' {
					if _, _, err := s.str(); err != nil {
						return err
					}
					if err := s.expect(':'); err != nil {
						return err
					}
				}
			case c == '}' && top == '{', c == ']' && top == '[':
				s.i++
				stack = stack[:len(stack)-1]
				continue
			case c == eof:
				return errTruncated
			default:
				return s.errorf("want ',' or the end of the %s", map[byte]string{'{': "object", '[': "array"}[top])
			}
			break
		}
	}
}

func (s *scanner) literal(lit string) error {
	if len(s.b)-s.i < len(lit) {
		if string(s.b[s.i:]) == lit[:len(s.b)-s.i] {
			return errTruncated
		}
		return s.errorf("bad literal")
	}
	if string(s.b[s.i:s.i+len(lit)]) != lit {
		return s.errorf("bad literal")
	}
	s.i += len(lit)
	return nil
}

// number consumes -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (s *scanner) number() error {
	digits := func() int {
		n := 0
		for s.i < len(s.b) && '0' <= s.b[s.i] && s.b[s.i] <= '9' {
			s.i++
			n++
		}
		return n
	}
	at := func(c byte) bool { return s.i < len(s.b) && s.b[s.i] == c }
	end := func() error {
		if s.i >= len(s.b) {
			return errTruncated
		}
		return s.errorf("bad number")
	}
	if at('-') {
		s.i++
	}
	switch {
	case at('0'):
		s.i++
	case digits() == 0:
		return end()
	}
	if at('.') {
		s.i++
		if digits() == 0 {
			return end()
		}
	}
	if at('e') || at('E') {
		s.i++
		if at('+') || at('-') {
			s.i++
		}
		if digits() == 0 {
			return end()
		}
	}
	return nil
}

// null consumes a null if one is next.
func (s *scanner) null() (bool, error) {
	if s.peek() != 'n' {
		return false, nil
	}
	return true, s.literal("null")
}

// optText consumes a string or null.
func (s *scanner) optText() (string, error) {
	if isNull, err := s.null(); isNull || err != nil {
		return "", err
	}
	return s.text()
}

// end checks that only space follows the value.
func (s *scanner) end() error {
	if s.peek() != eof {
		return s.errorf("data after the top-level value")
	}
	return nil
}

// decodeObject reads an object's type and metadata from its JSON in one
// pass. If strip is set and metadata.managedFields is present, the returned
// Object's Data is a new slice without it; otherwise it is raw itself.
func decodeObject(raw []byte, strip bool) (*Object, header, error) {
	s := &scanner{b: raw}
	o := &Object{Data: raw}
	var h header
	var cuts []span // the bytes of managedFields members, with a comma
	err := s.fields(func() error {
		k, err := s.member("apiVersion", "kind", "metadata")
		if err != nil {
			return err
		}
		switch k {
		case 0:
			h.apiVersion, err = s.optText()
		case 1:
			h.kind, err = s.optText()
		case 2:
			// A repeated key wins over the earlier ones.
			o.Namespace, o.Name, h.uid, o.ResourceVersion, o.Labels, cuts = "", "", "", "", nil, cuts[:0]
			err = s.metadata(o, &h, &cuts)
		default:
			err = s.skip()
		}
		return err
	})
	if err == nil {
		err = s.end()
	}
	if err != nil {
		return nil, header{}, fmt.Errorf("decoding object: %w", err)
	}
	if strip && len(cuts) > 0 {
		o.Data = cutSpans(raw, cuts)
	}
	return o, h, nil
}

// span is a byte range [from, to).
type span struct{ from, to int }

// cutSpans returns a copy of b without the spans, which are in order and
// may overlap.
// The copy is allocated at its exact size: it is what the store keeps.
func cutSpans(b []byte, spans []span) []byte {
	n, at := len(b), 0
	for _, c := range spans {
		n -= max(c.to, at) - max(c.from, at)
		at = max(at, c.to)
	}
	out := make([]byte, 0, n)
	at = 0
	for _, c := range spans {
		if c.from > at {
			out = append(out, b[at:c.from]...)
		}
		at = max(at, c.to)
	}
	return append(out, b[at:]...)
}

// metadata reads the fields of metadata into o and h and appends to cuts
// the spans that remove managedFields, each with one adjacent comma.
func (s *scanner) metadata(o *Object, h *header, cuts *[]span) error {
	if isNull, err := s.null(); isNull || err != nil {
		return err
	}
	first, prevEnd := true, 0
	err := s.fields(func() error {
		keyStart := s.i
		k, err := s.member("namespace", "name", "uid", "resourceVersion", "labels", "managedFields")
		if err != nil {
			return err
		}
		switch k {
		case 0:
			o.Namespace, err = s.optText()
		case 1:
			o.Name, err = s.optText()
		case 2:
			h.uid, err = s.optText()
		case 3:
			o.ResourceVersion, err = s.optText()
		case 4:
			o.Labels, err = s.labels()
		case 5:
			if err = s.skip(); err == nil {
				c := span{prevEnd, s.i} // the comma before it and the member
				if first {
					// The member and the comma after it, if any.
					c.from = keyStart
					if s.peek() == ',' {
						c.to = s.i + 1
					}
				}
				*cuts = append(*cuts, c)
			}
		default:
			err = s.skip()
		}
		first, prevEnd = false, s.i
		return err
	})
	return err
}

// labels reads a map of strings, or null.
func (s *scanner) labels() (map[string]string, error) {
	if isNull, err := s.null(); isNull || err != nil {
		return nil, err
	}
	m := map[string]string{}
	err := s.fields(func() error {
		k, err := s.text()
		if err != nil {
			return err
		}
		if err := s.expect(':'); err != nil {
			return err
		}
		v, err := s.optText()
		m[k] = v
		return err
	})
	return m, err
}
