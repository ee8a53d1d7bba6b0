{{/*
The RayCluster's groups: the head and ONE worker-group template rendered per role. Pods come from the
one pod template (templates/_pod.tpl); a group adds its KubeRay fields (size, Ray node labels, rayStartParams).
*/}}

{{/* headGroupSpec (YAML). num-cpus 0: no replica lands on the head. dashboard-host 0.0.0.0: the operator reaches it
(the NetworkPolicy and Ray token auth keep everyone else out). */}}
{{- define "ray-llm-disagg.headGroup" -}}
{{- $v := .Values.head -}}
serviceType: ClusterIP
{{- with $v.rayLabels }}
labels:
  {{- toYaml . | nindent 2 }}
{{- end }}
rayStartParams:
  {{- toYaml (merge (dict "num-cpus" "0" "dashboard-host" "0.0.0.0") (deepCopy (default dict $v.rayStartParams))) | nindent 2 }}
template:
  {{- include "ray-llm-disagg.podTemplate" (dict "root" . "group" "head") | nindent 2 }}
{{- end -}}

{{/* One worker group ({root, role}); the roles differ only in their values block and the label naming the role. */}}
{{- define "ray-llm-disagg.workerGroup" -}}
{{- $root := .root -}}
{{- $role := .role -}}
{{- $V := $root.Values -}}
{{- $v := index $V $role -}}
- groupName: {{ $role }}
  numOfHosts: {{ include "ray-llm-disagg.numOfHosts" . }}
  {{- if $v.autoscaling.enabled }}
  replicas: {{ int $v.autoscaling.minReplicas }}
  minReplicas: {{ int $v.autoscaling.minReplicas }}
  maxReplicas: {{ int $v.autoscaling.maxReplicas }}
  {{- with $v.idleTimeoutSeconds }}
  idleTimeoutSeconds: {{ int . }}
  {{- end }}
  {{- else }}
  replicas: {{ int $v.replicas }}
  minReplicas: {{ int $v.replicas }}
  maxReplicas: {{ int $v.replicas }}
  {{- end }}
  # Ray node labels (KubeRay >= 1.5; also pod labels): the app pins this role's placement groups to them.
  labels:
    {{- toYaml (merge (dict $V.placement.roleLabelKey $role) (deepCopy (default dict $v.rayLabels))) | nindent 4 }}
  rayStartParams:
    {{- toYaml (default dict $v.rayStartParams) | nindent 4 }}
  template:
    {{- include "ray-llm-disagg.podTemplate" (dict "root" $root "group" $role) | nindent 4 }}
{{- end -}}
