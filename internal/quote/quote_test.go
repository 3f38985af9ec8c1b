package quote

import (
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestString(t *testing.T) {
	for _, tt := range []struct {
		name, in, want string
	}{
		{"empty", "", `""`},
		{"short", "a=b", `"a=b"`},
		{"exactly Max", strings.Repeat("x", Max), `"` + strings.Repeat("x", Max) + `"`},
		{"long", strings.Repeat("x", 2000), `"` + strings.Repeat("x", Max) + `"... (2000 bytes)`},
		{"cut at a rune boundary", strings.Repeat("x", Max-1) + "é" + "y", `"` + strings.Repeat("x", Max-1) + `"... (66 bytes)`},
		{"not UTF-8", strings.Repeat("\xff", Max+1), `"` + strings.Repeat(`\xff`, Max) + `"... (65 bytes)`},
		{"control characters are escaped", "a\nb\"", `"a\nb\""`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := String(tt.in); got != tt.want {
				t.Fatalf("String(%.80q) = %s, want %s", tt.in, got, tt.want)
			}
		})
	}
}

// TestMessage: Message keeps a message's own words and cuts what it
// repeats of an input, wherever and however often it does.
func TestMessage(t *testing.T) {
	label := "spec." + strings.Repeat("x", 2000)
	selector := label + "=v"
	for _, tt := range []struct {
		name   string
		msg    string
		inputs []string
		want   string
	}{
		{"short, nothing repeated", "field label not supported: spec.a", []string{"spec.a=v"}, "field label not supported: spec.a"},
		{"a field of the input", "field label not supported: " + label, []string{selector},
			"field label not supported: " + label[:Max] + "..."},
		{"the input twice", "selector " + selector + " and again " + selector, []string{selector},
			"selector " + selector[:Max] + "... and again " + selector[:Max] + "..."},
		{"short repetitions are kept", "a=b: " + strings.Repeat("y", Max), []string{strings.Repeat("y", Max) + "z"},
			"a=b: " + strings.Repeat("y", Max)},
		{"its own words after a long repetition", "Unable to find configmaps that match field selector " + selector + ": field label not supported: " + label,
			[]string{selector}, "Unable to find configmaps that match field selector " + selector[:Max] + "...: field label not supported: " + label[:Max] + "..."},
		{"the input Go-quoted", fmt.Sprintf("%q is not a known field selector", strings.Repeat("\x01", 100)), []string{strings.Repeat("\x01", 100)},
			`"` + strings.Repeat(`\x01`, Max/4) + `..."` + " is not a known field selector"},
		{"long words of its own", strings.Repeat("w", 1000), nil, strings.Repeat("w", MaxMessage) + "..."},
		{"cut short right after a repetition", strings.Repeat("w", MaxMessage-Max) + selector + "tail", []string{selector},
			strings.Repeat("w", MaxMessage-Max) + selector[:Max] + "..."},
		{"invalid UTF-8", "bad \xff byte", nil, "bad ? byte"},
		{"cut at a rune boundary", strings.Repeat("é", Max), []string{strings.Repeat("é", Max)}, strings.Repeat("é", Max/2) + "..."},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := Message(tt.msg, tt.inputs...)
			if got != tt.want {
				t.Fatalf("Message = %q, want %q", got, tt.want)
			}
			if !utf8.ValidString(got) || len(got) > MaxMessage+len("...") {
				t.Fatalf("Message = %q: %d bytes, valid UTF-8 %t; want at most %d bytes of UTF-8", got, len(got), utf8.ValidString(got), MaxMessage+3)
			}
			for _, in := range tt.inputs {
				for i := 0; i+Max < len(in); i++ {
					if strings.Contains(got, in[i:i+Max+1]) {
						t.Fatalf("Message = %q repeats %d bytes of an input at %d", got, Max+1, i)
					}
				}
			}
		})
	}
}
