{{/* =========================================================================================
  Monitoring helpers: PodMonitor, PrometheusRule, Grafana dashboard ConfigMap.
========================================================================================= */}}

{{/* Metadata labels of a monitoring object: the chart's labels, then the object's own ({root, labels}); one key once. */}}
{{- define "ray-llm-disagg.monitoring.labels" -}}
{{- $labels := include "ray-llm-disagg.labels" .root | fromYaml -}}
{{- toYaml (merge (deepCopy (default dict .labels)) $labels) -}}
{{- end -}}

{{/* Namespace of a monitoring object ({root, namespace}): its own, else the release's. */}}
{{- define "ray-llm-disagg.monitoring.namespace" -}}
{{- default (include "ray-llm-disagg.namespace" .root) .namespace -}}
{{- end -}}

{{/*
PromQL label matchers that pick this release's series. The PodMonitor gives every series the labels
`namespace` (the pod's) and `app_kubernetes_io_instance` (the release); another scrape config can be
matched with monitoring.prometheusRule.selector.
*/}}
{{- define "ray-llm-disagg.monitoring.selector" -}}
{{- with .Values.monitoring.prometheusRule.selector -}}
{{- . -}}
{{- else -}}
{{- printf "namespace=%q,app_kubernetes_io_instance=%q" (include "ray-llm-disagg.namespace" .) .Release.Name -}}
{{- end -}}
{{- end -}}

{{/*
Matcher for one histogram bucket bound. Exposition formats write a bound as `2.5`, `1`, `1.0` or
`1e+00` (Prometheus 3 normalises to `1.0` on ingestion, 2.x keeps what the target wrote), so an
integral bound matches its usual spellings.
*/}}
{{- define "ray-llm-disagg.monitoring.le" -}}
{{- $v := float64 . -}}
{{- if eq $v (floor $v) -}}
{{- printf "le=~\"%d|%d\\\\.0\"" (int64 $v) (int64 $v) -}}
{{- else -}}
{{- printf "le=\"%v\"" $v -}}
{{- end -}}
{{- end -}}
