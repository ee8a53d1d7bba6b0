{{/*
Ingress annotations derived from other values, for the classes whose defaults would silently break the
endpoint: an ALB listens on HTTP 80 only and cuts idle connections after 60 s; ingress-nginx times reads
out after 60 s and buffers responses (streamed tokens arrive in bursts). The app itself waits up to
timeouts.firstTokenS for a first token, so the load balancer's idle/read timeout must exceed it.
*/}}

{{/*
The Ingress' paths (JSON list of {path, pathType}): ingress.paths (pathType Prefix unless given), or, when empty,
exactly the app's public routes: <serve.routePrefix>/v1 (Prefix: chat/completions, completions, models) and
<serve.routePrefix>/health (Exact: readiness). Never Serve's own endpoints under /-/ (/-/routes lists every app and
route prefix to anyone; the ALB health check reaches /-/healthz on the targets directly).
*/}}
{{- define "ray-llm-disagg.ingressPaths" -}}
{{- $out := list -}}
{{- range $p := .Values.ingress.paths -}}
{{- $out = append $out (dict "path" $p.path "pathType" (default "Prefix" $p.pathType)) -}}
{{- end -}}
{{- if not $out -}}
{{- $rp := trimSuffix "/" .Values.serve.routePrefix -}}
{{- $out = list (dict "path" (printf "%s/v1" $rp) "pathType" "Prefix") (dict "path" (printf "%s/health" $rp) "pathType" "Exact") -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* Derived annotations (JSON map) for ingress.className. */}}
{{- define "ray-llm-disagg.ingressDerived" -}}
{{- $I := .Values.ingress -}}
{{- $idle := include "ray-llm-disagg.lbIdleTimeout" . -}}
{{- $out := dict -}}
{{- if eq $I.className "alb" -}}
{{- $_ := set $out "alb.ingress.kubernetes.io/scheme" $I.alb.scheme -}}
{{- $_ := set $out "alb.ingress.kubernetes.io/target-type" "ip" -}}
{{- $_ := set $out "alb.ingress.kubernetes.io/healthcheck-path" "/-/healthz" -}}
{{- $_ := set $out "alb.ingress.kubernetes.io/load-balancer-attributes" (printf "idle_timeout.timeout_seconds=%s" $idle) -}}
{{- if $I.tls -}}
{{- $_ := set $out "alb.ingress.kubernetes.io/listen-ports" "[{\"HTTP\": 80}, {\"HTTPS\": 443}]" -}}
{{- $_ := set $out "alb.ingress.kubernetes.io/ssl-redirect" "443" -}}
{{- with $I.alb.certificateArn -}}{{- $_ := set $out "alb.ingress.kubernetes.io/certificate-arn" . -}}{{- end -}}
{{- else -}}
{{- $_ := set $out "alb.ingress.kubernetes.io/listen-ports" "[{\"HTTP\": 80}]" -}}
{{- end -}}
{{- else if eq $I.className "nginx" -}}
{{- $_ := set $out "nginx.ingress.kubernetes.io/proxy-read-timeout" $idle -}}
{{- $_ := set $out "nginx.ingress.kubernetes.io/proxy-send-timeout" $idle -}}
{{- $_ := set $out "nginx.ingress.kubernetes.io/proxy-buffering" "off" -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* The Ingress' annotations (JSON map): derived ones, the user's over them; the user's ALB attributes keep the derived idle timeout unless they set one. */}}
{{- define "ray-llm-disagg.ingressAnnotations" -}}
{{- $derived := include "ray-llm-disagg.ingressDerived" . | fromJson -}}
{{- $user := default dict .Values.ingress.annotations -}}
{{- $key := "alb.ingress.kubernetes.io/load-balancer-attributes" -}}
{{- $out := merge (deepCopy $user) $derived -}}
{{- if and (hasKey $derived $key) (hasKey $user $key) (not (contains "idle_timeout.timeout_seconds" (index $user $key))) -}}
{{- $_ := set $out $key (printf "%s,%s" (index $user $key) (index $derived $key)) -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* Contradictions between the user's annotations and the derived ones (JSON list of messages). */}}
{{- define "ray-llm-disagg.ingressAnnotationErrors" -}}
{{- $I := .Values.ingress -}}
{{- $user := default dict $I.annotations -}}
{{- $idle := int (include "ray-llm-disagg.lbIdleTimeout" .) -}}
{{- $errs := list -}}
{{- if eq $I.className "alb" -}}
{{- with index $user "alb.ingress.kubernetes.io/listen-ports" -}}
{{- $https := false -}}
{{- range $l := (. | fromJsonArray) -}}{{- if hasKey $l "HTTPS" -}}{{- $https = true -}}{{- end -}}{{- end -}}
{{- if and $I.tls (not $https) -}}
{{- $errs = append $errs (printf "ingress.annotations.alb.ingress.kubernetes.io/listen-ports: %s has no HTTPS listener, but ingress.tls is set (clients would be sent to https:// and find nothing); drop the annotation (the chart derives it) or add {\"HTTPS\": 443}." .) -}}
{{- end -}}
{{- end -}}
{{- with index $user "alb.ingress.kubernetes.io/load-balancer-attributes" -}}
{{- $m := regexFind "idle_timeout\\.timeout_seconds=[0-9]+" . -}}
{{- if and $m (lt (int (last (splitList "=" $m))) $idle) -}}
{{- $errs = append $errs (printf "ingress.annotations.alb.ingress.kubernetes.io/load-balancer-attributes: %s is shorter than the app's first-token deadline (timeouts.firstTokenS %v s; the chart sets %d s): the ALB would cut requests the app still serves. Raise it, or lower timeouts.firstTokenS." $m $.Values.timeouts.firstTokenS $idle) -}}
{{- end -}}
{{- end -}}
{{- with index $user "alb.ingress.kubernetes.io/scheme" -}}
{{- if ne . $I.alb.scheme -}}
{{- $errs = append $errs (printf "ingress.annotations.alb.ingress.kubernetes.io/scheme: %s contradicts ingress.alb.scheme (%s); set ingress.alb.scheme only." . $I.alb.scheme) -}}
{{- end -}}
{{- end -}}
{{- if and (hasKey $user "alb.ingress.kubernetes.io/ssl-redirect") (not $I.tls) -}}
{{- $errs = append $errs "ingress.annotations.alb.ingress.kubernetes.io/ssl-redirect: redirects to HTTPS, but ingress.tls is empty (no HTTPS listener); set ingress.tls." -}}
{{- end -}}
{{- else if eq $I.className "nginx" -}}
{{- range $k := list "nginx.ingress.kubernetes.io/proxy-read-timeout" "nginx.ingress.kubernetes.io/proxy-send-timeout" -}}
{{- with index $user $k -}}
{{- if lt (int (regexFind "^[0-9]+" (toString .))) $idle -}}
{{- $errs = append $errs (printf "ingress.annotations.%s: %s s is shorter than the app's first-token deadline (timeouts.firstTokenS %v s; the chart sets %d s): nginx would cut requests the app still serves." $k . $.Values.timeouts.firstTokenS $idle) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if eq (toString (index $user "nginx.ingress.kubernetes.io/proxy-buffering")) "on" -}}
{{- $errs = append $errs "ingress.annotations.nginx.ingress.kubernetes.io/proxy-buffering: on holds streamed tokens back in nginx's buffers; leave it off (the chart's default)." -}}
{{- end -}}
{{- end -}}
{{- /* what the Ingress routes must reach the app: no path rewriting (an ALB cannot rewrite) */ -}}
{{- $rp := trimSuffix "/" $.Values.serve.routePrefix -}}
{{- $api := printf "%s/v1/" $rp -}}
{{- $health := printf "%s/health" $rp -}}
{{- range $i, $p := include "ray-llm-disagg.ingressPaths" $ | fromJsonArray -}}
{{- $path := printf "%s/" (trimSuffix "/" $p.path) -}}
{{- $ok := false -}}
{{- if eq $p.pathType "Exact" -}}
{{- $ok = or (eq $p.path $health) (and (hasPrefix $api $p.path) (ne $p.path $api)) -}}
{{- else -}}
{{- $ok = or (hasPrefix $path $api) (hasPrefix $api $path) (eq $path (printf "%s/" $health)) -}}
{{- end -}}
{{- /* opted in: Serve itself answers under /-/ */ -}}
{{- if and $I.exposeSystemPaths (or (hasPrefix "/-/" $path) (eq $path "/-/")) -}}{{- $ok = true -}}{{- end -}}
{{- if not $ok -}}
{{- $errs = append $errs (printf "ingress.paths[%d].path: %s (%s) does not lead to the app, whose routes are %s... and %s (serve.routePrefix %s): the Ingress forwards paths unchanged, so requests would 404. Use a path that prefixes %s or lies under it, or %s, or move serve.routePrefix under it." $i $p.path $p.pathType $api $health $.Values.serve.routePrefix $api $health) -}}
{{- end -}}
{{- end -}}
{{- /* TLS: the host must be covered; non-ALB classes need the certificate Secret */ -}}
{{- if and $I.tls $I.host -}}
{{- $covered := false -}}
{{- range $t := $I.tls -}}
{{- range $h := default list $t.hosts -}}
{{- if or (eq $h $I.host) (and (hasPrefix "*." $h) (hasSuffix (trimPrefix "*" $h) $I.host) (not (contains "." (trimSuffix (trimPrefix "*" $h) $I.host)))) -}}{{- $covered = true -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- if not $covered -}}
{{- $errs = append $errs (printf "ingress.tls: no entry covers ingress.host %s in its hosts, so HTTPS for it would get another certificate (ALB picks certificates by these hosts). Add it to ingress.tls[].hosts." $I.host) -}}
{{- end -}}
{{- end -}}
{{- if ne $I.className "alb" -}}
{{- range $i, $t := $I.tls -}}
{{- if not $t.secretName -}}
{{- $errs = append $errs (printf "ingress.tls[%d].secretName: required for ingress class %q (only the ALB controller takes certificates from ACM); without it the controller serves its default certificate." $i $I.className) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toJson $errs -}}
{{- end -}}
