package main

import (
	"strings"
	"testing"
)

func TestParseFlagsNamesTheBadFlag(t *testing.T) {
	tests := []struct {
		args []string
		want string // in the error; "" for success
	}{
		{[]string{"-kubeconfig", "k"}, ""},
		{[]string{"-listen-tcp", "127.0.0.1:7650", "-socket", ""}, ""},
		{[]string{"-listen-tcp", "0.0.0.0:7650"}, "-listen-tcp"},
		{[]string{"-listen-tcp", "nonsense"}, "-listen-tcp"},
		{[]string{"-socket", ""}, "-socket"},
		{[]string{"-scope", "galaxy"}, "-scope"},
		{[]string{"-linger-ttl", "0s"}, "-linger-ttl"},
		{[]string{"-log-max-events", "0"}, "-log-max-events"},
		{[]string{"-upstream-timeout", "0s"}, "-upstream-timeout"},
		{[]string{"-log-max-bytes", "-1"}, "-log-max-bytes"},
		{[]string{"-log-min-age", "-1s"}, "-log-min-age"},
		{[]string{"-log-level", "loud"}, "-log-level"},
		{[]string{"-linger-ttl", "soon"}, "linger-ttl"},
		{[]string{"extra"}, "unexpected arguments"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			_, err := parseFlags(tt.args)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("error = %v, want one naming %q", err, tt.want)
			}
		})
	}
}
