{{- /*
informerd.goMemLimit is GOMEMLIMIT for the daemon: goMemLimit if set, else
7/8 of resources.limits.memory (448MiB of 512Mi), the share the daemon
itself gives the Go runtime when it reads only the container's limit
(cmd/informerd/memory.go), so that what the runtime does not count has room
below the limit; empty without a limit. The limit must be an integer,
optionally with a unit (Ki, Mi, Gi, Ti, k, M, G, T).
*/ -}}
{{- define "informerd.goMemLimit" -}}
{{- if .Values.goMemLimit -}}
{{- .Values.goMemLimit -}}
{{- else -}}
{{- $limit := dig "limits" "memory" "" (.Values.resources | default dict) -}}
{{- if kindIs "float64" $limit }}{{ $limit = int64 $limit }}{{ end -}}
{{- $limit = toString $limit -}}
{{- if $limit -}}
{{- if not (regexMatch "^[0-9]+(Ki|Mi|Gi|Ti|k|M|G|T)?$" $limit) -}}
{{- fail (printf "resources.limits.memory %q: to derive GOMEMLIMIT (7/8 of it) the chart needs an integer with an optional unit, such as 512Mi or 1Gi; write it so, or set goMemLimit" $limit) -}}
{{- end -}}
{{- $units := dict "" 1 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 -}}
{{- $n := regexFind "^[0-9]+" $limit -}}
{{- $bytes := mul (int64 $n) (get $units (trimPrefix $n $limit)) -}}
{{- $go := mul (div $bytes 8) 7 -}}
{{- if eq (mod $go 1048576) 0 -}}
{{- printf "%dMiB" (div $go 1048576) -}}
{{- else -}}
{{- $go -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
