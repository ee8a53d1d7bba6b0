{{/* Names: chart, release objects, namespace, image, versions. */}}

{{/* Chart name. */}}
{{- define "ray-llm-disagg.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Full name: the RayService name. Not truncated: a name KubeRay cannot take fails in
"ray-llm-disagg.validate" instead of being silently shortened (two releases could collide).
*/}}
{{- define "ray-llm-disagg.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Namespace of every object: namespaceOverride or the release namespace. */}}
{{- define "ray-llm-disagg.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end -}}

{{/* Chart label value. */}}
{{- define "ray-llm-disagg.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* ServiceAccount used by head and workers. */}}
{{- define "ray-llm-disagg.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "ray-llm-disagg.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Name of the serve Service KubeRay creates for the RayService (<rayservice>-serve-svc). */}}
{{- define "ray-llm-disagg.serveServiceName" -}}
{{- printf "%s-serve-svc" (include "ray-llm-disagg.fullname" .) -}}
{{- end -}}

{{/* Runtime image; the tag defaults to appVersion (the Ray/vLLM stack in versions.env). */}}
{{- define "ray-llm-disagg.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag | toString) -}}
{{- end -}}
{{- end -}}

{{/* Ray version from Chart.yaml (one place in the chart; tests check it against versions.env). */}}
{{- define "ray-llm-disagg.rayVersion" -}}
{{- index .Chart.Annotations "ray-llm-disagg.io/ray-version" -}}
{{- end -}}

{{/* Where the API-key Secret is mounted in every Ray container (auth.apiKeySecret). */}}
{{- define "ray-llm-disagg.apiKeysDir" -}}/etc/ray-llm-disagg/api-keys{{- end -}}

{{/* Where the overflow endpoint's key Secret is mounted in every Ray container (overflow.apiKeySecret). */}}
{{- define "ray-llm-disagg.overflowKeyDir" -}}/etc/ray-llm-disagg/overflow-key{{- end -}}

{{/* Base URL of the OpenAI API inside the cluster: the serve Service, its port and the route prefix. */}}
{{- define "ray-llm-disagg.serveUrl" -}}
{{- printf "http://%s.%s.svc:%d%s" (include "ray-llm-disagg.serveServiceName" .) (include "ray-llm-disagg.namespace" .) (int .Values.serve.port) (trimSuffix "/" .Values.serve.routePrefix) -}}
{{- end -}}
