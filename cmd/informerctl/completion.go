package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
)

var completionCommand = newCommand("completion", "bash|zsh|fish", "Print a shell completion script: source <(informerctl completion bash)",
	func(*flag.FlagSet, *struct{}) {}, completionCmd)

func completionCmd(_ context.Context, e *env, _ *struct{}, args []string) error {
	if len(args) != 1 {
		return usagef("completion", "want one shell: bash, zsh or fish")
	}
	var err error
	switch args[0] {
	case "bash":
		_, err = io.WriteString(e.stdout, bashCompletion())
	case "zsh":
		_, err = io.WriteString(e.stdout, "#compdef informerctl\n# zsh completion for informerctl: source <(informerctl completion zsh)\n"+
			"autoload -U +X compinit && compinit\nautoload -U +X bashcompinit && bashcompinit\n"+bashCompletion())
	case "fish":
		_, err = io.WriteString(e.stdout, fishCompletion())
	default:
		return usagef("completion", "shell %q: want bash, zsh or fish", args[0])
	}
	return writeError(err)
}

// flagInfo describes a flag for completion.
type flagInfo struct {
	name, usage string
	value       bool // takes a value
}

// flagsOf lists the flags of c (nil: the connection flags informerctl
// takes before a command), sorted by name.
func flagsOf(c *command) []flagInfo {
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	if c != nil {
		c.flags(fs)
	}
	conn := defaultConn
	conn.register(fs)
	var out []flagInfo
	fs.VisitAll(func(f *flag.Flag) {
		b, ok := f.Value.(interface{ IsBoolFlag() bool })
		out = append(out, flagInfo{name: f.Name, usage: f.Usage, value: !ok || !b.IsBoolFlag()})
	})
	return out
}

// flagValues are the values completed after a flag, by command ("" for
// any); files completes file names.
func flagValues(cmd, name string) (values string, files bool) {
	switch name {
	case "address", "token-file", "ca-file", "f":
		return "", true
	case "o", "output":
		if cmd == "version" {
			return "json yaml", false
		}
		return "wide json yaml name", false
	case "scope":
		return "automatic root namespace", false
	}
	return "", false
}

// bashCompletion is the bash script: commands, each command's flags, the
// values of -o and friends, file names after flags that take files.
func bashCompletion() string {
	var valued []string
	var cases strings.Builder
	for _, c := range commands {
		var names []string
		for _, f := range flagsOf(c) {
			names = append(names, "-"+f.name)
			if f.value && !slices.Contains(valued, f.name) {
				valued = append(valued, f.name)
			}
		}
		args := ""
		if c.name == "completion" {
			args = "bash zsh fish"
		}
		fmt.Fprintf(&cases, "        %s) flags=%q; args=%q ;;\n", c.name, strings.Join(names, " "), args)
	}
	var global []string
	for _, f := range flagsOf(nil) {
		global = append(global, "-"+f.name)
	}
	return fmt.Sprintf(`# bash completion for informerctl: source <(informerctl completion bash)
_informerctl() {
    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"
    local valued=" %s " cmd="" flags="" args="" w i
    COMPREPLY=()
    for ((i = 1; i < COMP_CWORD; i++)); do
        w="${COMP_WORDS[i]}"
        case "$w" in
        -*=*) ;;
        -*) w="${w#-}"; [[ "$valued" == *" ${w#-} "* ]] && ((i++)) ;;
        *) cmd="$w"; break ;;
        esac
    done
    w="${prev#-}"; w="${w#-}"
    if [[ "$prev" == -* && "$valued" == *" $w "* ]]; then
        case "$w" in
        o|output)
            if [[ "$cmd" == version ]]; then w="json yaml"; else w="wide json yaml name"; fi
            COMPREPLY=($(compgen -W "$w" -- "$cur")); return ;;
        scope) COMPREPLY=($(compgen -W "automatic root namespace" -- "$cur")); return ;;
        address|token-file|ca-file|f) COMPREPLY=($(compgen -f -- "$cur")); return ;;
        *) return ;;
        esac
    fi
    case "$cmd" in
%s        "")
        if [[ "$cur" == -* ]]; then
            COMPREPLY=($(compgen -W %q -- "$cur"))
        else
            COMPREPLY=($(compgen -W %q -- "$cur"))
        fi
        return ;;
    esac
    if [[ "$cur" == -* ]]; then
        COMPREPLY=($(compgen -W "$flags" -- "$cur"))
    else
        COMPREPLY=($(compgen -W "$args" -- "$cur"))
    fi
}
complete -o default -F _informerctl informerctl
`, strings.Join(valued, " "), cases.String(), strings.Join(global, " "), strings.ReplaceAll(commandNames(), ",", ""))
}

// fishCompletion is the fish script, with each command's and flag's
// description.
func fishCompletion() string {
	var b strings.Builder
	b.WriteString("# fish completion for informerctl: informerctl completion fish | source\ncomplete -c informerctl -f\n")
	for _, f := range flagsOf(nil) {
		fmt.Fprintf(&b, "complete -c informerctl -n __fish_use_subcommand -o %s%s -d %s\n", f.name, fishValue("", f), fishQuote(f.usage))
	}
	for _, c := range commands {
		fmt.Fprintf(&b, "complete -c informerctl -n __fish_use_subcommand -a %s -d %s\n", c.name, fishQuote(c.summary))
		seen := "'__fish_seen_subcommand_from " + c.name + "'"
		for _, f := range flagsOf(c) {
			fmt.Fprintf(&b, "complete -c informerctl -n %s -o %s%s -d %s\n", seen, f.name, fishValue(c.name, f), fishQuote(f.usage))
		}
		if c.name == "completion" {
			fmt.Fprintf(&b, "complete -c informerctl -n %s -a 'bash zsh fish'\n", seen)
		}
	}
	return b.String()
}

func fishValue(cmd string, f flagInfo) string {
	if !f.value {
		return ""
	}
	values, files := flagValues(cmd, f.name)
	switch {
	case files:
		return " -r -F"
	case values != "":
		return " -x -a " + fishQuote(values)
	}
	return " -x"
}

func fishQuote(s string) string {
	return "'" + strings.ReplaceAll(strings.ReplaceAll(s, `\`, `\\`), "'", `\'`) + "'"
}
