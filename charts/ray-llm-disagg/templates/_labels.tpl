{{/*
Labels. One merge everywhere, no duplicate keys: the chart's labels, then global.commonLabels, then
commonLabels (each wins over the previous), then the selector labels, which always win (the schema
refuses them in commonLabels/podLabels: the PDB, NetworkPolicy and affinity selectors need them).
*/}}

{{/* Selector labels of everything this release runs (name + instance). */}}
{{- define "ray-llm-disagg.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ray-llm-disagg.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* User labels: commonLabels over global.commonLabels (JSON map). */}}
{{- define "ray-llm-disagg.userLabels" -}}
{{- $global := default dict .Values.global -}}
{{- merge (deepCopy (default dict .Values.commonLabels)) (deepCopy (default dict $global.commonLabels)) | toJson -}}
{{- end -}}

{{/* Labels of every object (YAML). */}}
{{- define "ray-llm-disagg.labels" -}}
{{- $chart := dict "helm.sh/chart" (include "ray-llm-disagg.chart" .) "app.kubernetes.io/version" (.Chart.AppVersion | toString) "app.kubernetes.io/part-of" "ray-llm-disagg" -}}
{{- $fixed := include "ray-llm-disagg.selectorLabels" . | fromYaml -}}
{{- $_ := set $fixed "app.kubernetes.io/managed-by" .Release.Service -}}
{{- $user := include "ray-llm-disagg.userLabels" . | fromJson -}}
{{- toYaml (merge $fixed $user $chart) -}}
{{- end -}}

{{/* Labels of an object of one component ({root, component}; YAML). */}}
{{- define "ray-llm-disagg.componentLabels" -}}
{{- $l := include "ray-llm-disagg.labels" .root | fromYaml -}}
{{- $_ := set $l "app.kubernetes.io/component" .component -}}
{{- toYaml $l -}}
{{- end -}}

{{/* Selector labels of a group's pods ({root, group}; JSON): name, instance, component, and the role label on workers. */}}
{{- define "ray-llm-disagg.groupSelector" -}}
{{- $s := include "ray-llm-disagg.selectorLabels" .root | fromYaml -}}
{{- $_ := set $s "app.kubernetes.io/component" .group -}}
{{- if ne .group "head" -}}{{- $_ := set $s .root.Values.placement.roleLabelKey .group -}}{{- end -}}
{{- toJson $s -}}
{{- end -}}

{{/* Pod labels of a group ({root, group}; YAML): user labels, then the group's podLabels, then its selector labels. */}}
{{- define "ray-llm-disagg.podLabels" -}}
{{- $v := index .root.Values .group -}}
{{- $user := include "ray-llm-disagg.userLabels" .root | fromJson -}}
{{- $sel := include "ray-llm-disagg.groupSelector" . | fromJson -}}
{{- toYaml (merge $sel (deepCopy (default dict $v.podLabels)) $user) -}}
{{- end -}}
