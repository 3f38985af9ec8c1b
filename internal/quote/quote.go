// Package quote bounds what informerd's messages repeat of a client's
// input, so that a client that sends megabytes gets a short answer and
// leaves short log lines and statuses: every message that repeats what a
// client sent goes through String (a value it names) or Message (text,
// such as a parser's or the API server's, that may repeat it).
package quote

import (
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Max bounds how many bytes of one client input a message repeats in one
// place.
const Max = 64

// MaxMessage bounds the bytes of text that Message returns, but for a
// final "...".
const MaxMessage = 256

// String returns s as a Go string literal for a message: all of it when it
// is at most Max bytes long, else its first Max bytes (cut at a rune
// boundary) followed by how long it was: "aaaa"... (2000 bytes).
func String(s string) string {
	if len(s) <= Max {
		return strconv.Quote(s)
	}
	return strconv.Quote(prefix(s, Max)) + "... (" + strconv.Itoa(len(s)) + " bytes)"
}

// Message returns msg, text that may repeat inputs (what a client sent)
// whole or in part, as they are or Go-quoted (%q, as Kubernetes' messages
// quote values), for a message: every run of more than Max bytes of it
// that occurs in one of inputs is cut to its first Max bytes and "...",
// what remains is cut to MaxMessage bytes (and "..."), and invalid UTF-8
// is replaced by "?". Its cost is bounded by MaxMessage and the inputs'
// length, however long msg is.
func Message(msg string, inputs ...string) string {
	inputs = slices.Clip(inputs) // append below must not write to the caller's array
	for _, in := range inputs {
		if q := strconv.Quote(in); q[1:len(q)-1] != in {
			inputs = append(inputs, q[1:len(q)-1])
		}
	}
	var b strings.Builder
	i := 0
	for i < len(msg) && b.Len() < MaxMessage {
		if n := repeated(msg[i:], inputs); n > 0 {
			b.WriteString(prefix(msg[i:i+n], Max))
			b.WriteString("...")
			i += n
			continue
		}
		b.WriteByte(msg[i])
		i++
	}
	out := b.String()
	if i < len(msg) {
		if out = prefix(out, MaxMessage); !strings.HasSuffix(out, "...") {
			out += "..."
		}
	}
	return strings.ToValidUTF8(out, "?")
}

// repeated returns the length of the longest prefix of s longer than Max
// bytes that occurs in one of inputs, or 0 if none does.
func repeated(s string, inputs []string) int {
	if len(s) <= Max {
		return 0
	}
	longest := 0
	for _, in := range inputs {
		if !strings.Contains(in, s[:Max+1]) {
			continue
		}
		// Occurring is monotone in the prefix's length: search for the
		// longest that does.
		lo, hi := Max+1, min(len(s), len(in)) // s[:lo] occurs in in
		for lo < hi {
			mid := (lo + hi + 1) / 2
			if strings.Contains(in, s[:mid]) {
				lo = mid
			} else {
				hi = mid - 1
			}
		}
		longest = max(longest, lo)
	}
	return longest
}

// prefix returns at most the first n bytes of s, cut at a rune boundary
// (at a byte, if s is not UTF-8 there).
func prefix(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for i := n; i > n-utf8.UTFMax && i > 0; i-- {
		if utf8.RuneStart(s[i]) {
			return s[:i]
		}
	}
	return s[:n]
}
