{{/*
values -> the app's args (serve_app.config.AppConfig): a plain mirror. The keys AppConfig has are taken
from .Values at the same paths and renamed camelCase -> snake_case by walking the generated field tree
(templates/_generated.tpl, from AppConfig itself); keys the app does not have (Kubernetes ones) are not
passed. Optional fields left empty (null, "", {} or []; a number such as admission.maxQueued 0 is a value)
stay unset. Then the chart fills what it derives:
  - aggregated mode: no prefill, kv_transfer or remote_prefill_min_tokens (only decode runs)
  - kv_transfer.backend / buffer_device when empty (from efa.enabled / accelerator)
  - <role>.accelerator_type when empty (from the role's instance type; none on CPU)
  - auth.api_keys_file from auth.apiKeySecret (the Secret mounted on every Ray pod)
  - overflow.api_key_file from overflow.apiKeySecret (likewise)
  - autoscaling.mode off when values hold YAML's false (an unquoted `off`)
  - frontend.max_replicas_per_node when null: 1 where the Ray pods can hold every frontend replica that way
and, with autoscaling.mode coupled, the application's `autoscaling_policy` (the coupled policy, its kwargs the
args' autoscaling section).
*/}}

{{/* Mirror of one level ({fields, values}; JSON). */}}
{{- define "ray-llm-disagg.mirror" -}}
{{- $out := dict -}}
{{- $vals := default dict .values -}}
{{- range $snake, $f := .fields -}}
{{- if hasKey $vals $f.v -}}
{{- $val := index $vals $f.v -}}
{{- if and (hasKey $f "f") (kindIs "map" $val) -}}
{{- $_ := set $out $snake (include "ray-llm-disagg.mirror" (dict "fields" $f.f "values" $val) | fromJson) -}}
{{- else if not (and $f.o (or (kindIs "invalid" $val) (and (or (kindIs "string" $val) (kindIs "map" $val) (kindIs "slice" $val)) (empty $val)))) -}}
{{- $_ := set $out $snake (deepCopy $val) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* The app's args (YAML). */}}
{{- define "ray-llm-disagg.appArgs" -}}
{{- $V := .Values -}}
{{- $args := include "ray-llm-disagg.mirror" (dict "fields" (include "ray-llm-disagg.appFields" . | fromJson) "values" $V) | fromJson -}}
{{- if eq $V.mode "aggregated" -}}
{{- $_ := unset $args "prefill" -}}
{{- $_ := unset $args "kv_transfer" -}}
{{- $_ := unset $args "remote_prefill_min_tokens" -}}
{{- else -}}
{{- $kv := $args.kv_transfer -}}
{{- $_ := set $kv "backend" (include "ray-llm-disagg.kvBackend" .) -}}
{{- $_ := set $kv "buffer_device" (include "ray-llm-disagg.kvBufferDevice" .) -}}
{{- end -}}
{{- range $role := splitList " " (include "ray-llm-disagg.roles" .) -}}
{{- $r := index $args $role -}}
{{- $acc := include "ray-llm-disagg.acceleratorType" (dict "root" $ "role" $role) -}}
{{- if $acc -}}{{- $_ := set $r "accelerator_type" $acc -}}{{- else -}}{{- $_ := unset $r "accelerator_type" -}}{{- end -}}
{{- end -}}
{{- if $V.auth.apiKeySecret.name -}}
{{- $auth := default dict $args.auth -}}
{{- $_ := set $auth "api_keys_file" (printf "%s/%s" (include "ray-llm-disagg.apiKeysDir" .) $V.auth.apiKeySecret.key) -}}
{{- $_ := set $args "auth" $auth -}}
{{- end -}}
{{- if $V.overflow.apiKeySecret.name -}}
{{- $overflow := default dict $args.overflow -}}
{{- $_ := set $overflow "api_key_file" (printf "%s/%s" (include "ray-llm-disagg.overflowKeyDir" .) $V.overflow.apiKeySecret.key) -}}
{{- $_ := set $args "overflow" $overflow -}}
{{- end -}}
{{- with include "ray-llm-disagg.frontendPerNode" . -}}
{{- $_ := set $args.frontend "max_replicas_per_node" (int .) -}}
{{- end -}}
{{- $as := $args.autoscaling -}}
{{- if and $as (kindIs "bool" $as.mode) -}}{{- $_ := set $as "mode" "off" -}}{{- end -}}
{{- toYaml $args -}}
{{- end -}}

{{/* The Serve deployments build_app makes (serve_app.config.AppConfig.deployment_names; JSON list). */}}
{{- define "ray-llm-disagg.deploymentNames" -}}
{{- $naming := include "ray-llm-disagg.deploymentNaming" . | fromJson -}}
{{- $model := .Values.model.id | replace "/" "--" | replace "." "_" -}}
{{- $names := list -}}
{{- if not .Values.frontend.directStreaming -}}{{- $names = append $names $naming.frontend -}}{{- end -}}
{{- $roles := ternary (list "aggregated") (list "prefill" "decode") (eq .Values.mode "aggregated") -}}
{{- range $role := $roles -}}{{- $names = append $names (printf "%s%s" (index $naming.prefix $role) $model) -}}{{- end -}}
{{- toJson $names -}}
{{- end -}}

{{/* serveConfigV2 (YAML): Serve's HTTP options and the one application. The live args
(serve_app.config.LIVE_FIELDS: remotePrefillMinTokens, timeouts, limits) go to every deployment's
user_config instead of args: Serve restarts every replica (engines included) when args change, and
applies a user_config change in place (AppConfig.serve_deployments renders the same). */}}
{{- define "ray-llm-disagg.serveConfigV2" -}}
{{- $http := merge (dict "host" "0.0.0.0" "port" (int .Values.serve.port)) (deepCopy (default dict .Values.serve.httpOptions)) -}}
{{- $args := include "ray-llm-disagg.appArgs" . | fromYaml -}}
{{- $live := dict -}}
{{- range $field := include "ray-llm-disagg.liveFields" . | fromJsonArray -}}
{{- if hasKey $args $field -}}
{{- $_ := set $live $field (index $args $field) -}}
{{- $_ := unset $args $field -}}
{{- end -}}
{{- end -}}
{{- $deployments := list -}}
{{- range $name := include "ray-llm-disagg.deploymentNames" . | fromJsonArray -}}
{{- $deployments = append $deployments (dict "name" $name "user_config" $live) -}}
{{- end -}}
{{- $app := dict "name" .Values.serve.appName "route_prefix" .Values.serve.routePrefix "import_path" .Values.serve.importPath "args" $args "deployments" $deployments -}}
{{- if eq (toString .Values.autoscaling.mode) "coupled" -}}
{{- /* Ray Serve's application-level policy (serve_app.config.AppConfig.app_autoscaling_policy builds the same) */ -}}
{{- $_ := set $app "autoscaling_policy" (dict "policy_function" "serve_app.autoscaling.entry:CoupledPolicy" "policy_kwargs" (dict "autoscaling" $args.autoscaling)) -}}
{{- end -}}
{{- toYaml (dict "http_options" $http "applications" (list $app)) -}}
{{- end -}}
