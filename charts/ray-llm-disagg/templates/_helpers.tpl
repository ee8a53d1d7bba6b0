{{/* =========================================================================================
  Names and labels
========================================================================================= */}}

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

{{/* Chart label value. */}}
{{- define "ray-llm-disagg.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels: on every pod the chart owns; also used by the role (anti-)affinity terms. */}}
{{- define "ray-llm-disagg.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ray-llm-disagg.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The chart's global values (set once by an umbrella chart); an empty map when there are none. */}}
{{- define "ray-llm-disagg.global" -}}
{{- toYaml (default dict .Values.global) -}}
{{- end -}}

{{/* User labels for every object and pod: commonLabels over global.commonLabels (YAML, may be empty). */}}
{{- define "ray-llm-disagg.userLabels" -}}
{{- $global := include "ray-llm-disagg.global" . | fromYaml -}}
{{- $labels := merge (deepCopy (default dict .Values.commonLabels)) (deepCopy (default dict $global.commonLabels)) -}}
{{- with $labels -}}{{- toYaml . -}}{{- end -}}
{{- end -}}

{{/* Image pull secrets: imagePullSecrets plus global.imagePullSecrets, first occurrence of a name wins (YAML list, may be empty). */}}
{{- define "ray-llm-disagg.imagePullSecrets" -}}
{{- $global := include "ray-llm-disagg.global" . | fromYaml -}}
{{- $seen := dict -}}
{{- $out := list -}}
{{- range concat (default list .Values.imagePullSecrets) (default list $global.imagePullSecrets) -}}
{{- if not (hasKey $seen .name) -}}
{{- $_ := set $seen .name true -}}
{{- $out = append $out . -}}
{{- end -}}
{{- end -}}
{{- with $out -}}{{- toYaml . -}}{{- end -}}
{{- end -}}

{{/* Common labels. */}}
{{- define "ray-llm-disagg.labels" -}}
helm.sh/chart: {{ include "ray-llm-disagg.chart" . }}
{{ include "ray-llm-disagg.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: ray-llm-disagg
{{- with include "ray-llm-disagg.userLabels" . }}
{{ . }}
{{- end }}
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

{{/* =========================================================================================
  Derived settings
========================================================================================= */}}

{{/* Roles rendered as worker groups, space separated: aggregated mode serves from decode only. */}}
{{- define "ray-llm-disagg.roles" -}}
{{- if eq .Values.mode "aggregated" -}}decode{{- else -}}prefill decode{{- end -}}
{{- end -}}

{{/* NIXL backend: explicit, or LIBFABRIC with EFA and UCX without. */}}
{{- define "ray-llm-disagg.kvBackend" -}}
{{- if .Values.kvTransfer.backend -}}{{ .Values.kvTransfer.backend }}
{{- else if .Values.efa.enabled -}}LIBFABRIC
{{- else -}}UCX
{{- end -}}
{{- end -}}

{{/* KV buffer device: explicit, or cuda on GPU and cpu on the CPU accelerator. */}}
{{- define "ray-llm-disagg.kvBufferDevice" -}}
{{- if .Values.kvTransfer.bufferDevice -}}{{ .Values.kvTransfer.bufferDevice }}
{{- else if eq .Values.accelerator "gpu" -}}cuda
{{- else -}}cpu
{{- end -}}
{{- end -}}

{{/* "true" when the chart must set NIXL side-channel ports itself (Ray 2.58 does not for the push connector). */}}
{{- define "ray-llm-disagg.explicitSideChannel" -}}
{{- if and (ne .Values.mode "aggregated") (eq .Values.kvTransfer.connector "NixlPushConnector") -}}true{{- end -}}
{{- end -}}

{{/* "true" when any rendered role autoscales. */}}
{{- define "ray-llm-disagg.autoscaling" -}}
{{- range $role := splitList " " (include "ray-llm-disagg.roles" $) -}}
{{- if (index $.Values $role).autoscaling.enabled -}}true{{- end -}}
{{- end -}}
{{- end -}}

{{/* Pods per replica of a role ({root, role}): TP x PP / gpusPerHost on GPU, 1 on CPU. */}}
{{- define "ray-llm-disagg.numOfHosts" -}}
{{- $v := index .root.Values .role -}}
{{- if eq .root.Values.accelerator "gpu" -}}
{{- div (mul (int $v.tensorParallelSize) (int $v.pipelineParallelSize)) (max 1 (int $v.gpusPerHost)) -}}
{{- else -}}1{{- end -}}
{{- end -}}

{{/* Instance type a role's nodeSelector names ({root, role}); empty if none. */}}
{{- define "ray-llm-disagg.instanceType" -}}
{{- $v := index .root.Values .role -}}
{{- $ns := default dict $v.nodeSelector -}}
{{- default (index $ns "beta.kubernetes.io/instance-type") (index $ns "node.kubernetes.io/instance-type") | default "" -}}
{{- end -}}

{{/* =========================================================================================
  Checks a JSON schema cannot express. Every message names the key and the reason.
========================================================================================= */}}
{{- define "ray-llm-disagg.validate" -}}
{{- $V := .Values -}}
{{- $errs := list -}}
{{- $supported := index .Chart.Annotations "ray-llm-disagg.io/kuberay-supported" -}}

{{- /* KubeRay present? (see capabilitiesCheck in values.yaml) */ -}}
{{- if ne $V.capabilitiesCheck "never" -}}
{{- $live := eq $V.capabilitiesCheck "always" -}}
{{- range .Capabilities.APIVersions -}}
{{- $group := "" -}}
{{- if contains "/" . -}}{{- $group = first (splitList "/" .) -}}{{- end -}}
{{- if and (contains "." $group) (not (hasSuffix ".k8s.io" $group)) -}}{{- $live = true -}}{{- end -}}
{{- end -}}
{{- if and $live (not (.Capabilities.APIVersions.Has "ray.io/v1/RayService")) -}}
{{- $errs = append $errs (printf "capabilitiesCheck: this cluster does not serve ray.io/v1 RayService, so the KubeRay operator is not installed. Install KubeRay %s (tested with %s), e.g. `helm install kuberay-operator kuberay/kuberay-operator --version %s` from https://ray-project.github.io/kuberay-helm/, then retry. To render without a cluster pass `--api-versions ray.io/v1/RayService` or set capabilitiesCheck=never." $supported (index .Chart.Annotations "ray-llm-disagg.io/kuberay-version") (trimPrefix "v" (index .Chart.Annotations "ray-llm-disagg.io/kuberay-version"))) -}}
{{- end -}}
{{- end -}}

{{- /* RayService name */ -}}
{{- $name := include "ray-llm-disagg.fullname" . -}}
{{- if gt (len $name) 47 -}}
{{- $errs = append $errs (printf "fullnameOverride: the RayService name %q (from the release name and fullnameOverride/nameOverride) is %d characters; KubeRay allows at most 47 (it appends a 6-character suffix to the RayCluster name, limit 53). Use a shorter release name or set fullnameOverride." $name (len $name)) -}}
{{- end -}}
{{- if not (regexMatch "^[a-z]([-a-z0-9]*[a-z0-9])?$" $name) -}}
{{- $errs = append $errs (printf "fullnameOverride: the RayService name %q must be a DNS-1035 label (lower case letters, digits and '-', starting with a letter); use another release name or set fullnameOverride." $name) -}}
{{- end -}}

{{- /* Accelerator */ -}}
{{- $gpu := eq $V.accelerator "gpu" -}}
{{- if not $gpu -}}
{{- if $V.efa.enabled -}}
{{- $errs = append $errs "efa.enabled: EFA is wired only for GPU workers; with accelerator: cpu set efa.enabled: false." -}}
{{- end -}}
{{- if $V.acceleratorType -}}
{{- $errs = append $errs (printf "acceleratorType: %q is a GPU type; Ray rejects an accelerator type with accelerator: cpu. Leave it empty." $V.acceleratorType) -}}
{{- end -}}
{{- if eq (include "ray-llm-disagg.kvBufferDevice" .) "cuda" -}}
{{- $errs = append $errs "kvTransfer.bufferDevice: cuda needs GPU workers; use cpu (or leave empty) with accelerator: cpu." -}}
{{- end -}}
{{- end -}}

{{- /* Engine env names (a schema propertyNames error would not name the key) */ -}}
{{- $envMaps := dict "engineEnv" $V.engineEnv -}}
{{- range $role := splitList " " (include "ray-llm-disagg.roles" $) -}}{{- $_ := set $envMaps (printf "%s.env" $role) (index $V $role).env -}}{{- end -}}
{{- range $where := keys $envMaps | sortAlpha -}}
{{- range $k := keys (default dict (index $envMaps $where)) | sortAlpha -}}
{{- if not (regexMatch "^[A-Za-z_][A-Za-z0-9_]*$" $k) -}}
{{- $errs = append $errs (printf "%s.%s: not a valid environment variable name." $where $k) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- /* Serve options the chart owns */ -}}
{{- range $k := list "host" "port" -}}
{{- if hasKey (default dict $V.serve.httpOptions) $k -}}
{{- $errs = append $errs (printf "serve.httpOptions.%s: set by the chart (host 0.0.0.0, port from serve.port); remove it." $k) -}}
{{- end -}}
{{- end -}}

{{- /* KV transfer backend */ -}}
{{- if and (eq (include "ray-llm-disagg.kvBackend" .) "LIBFABRIC") (not $V.efa.enabled) -}}
{{- $errs = append $errs "kvTransfer.backend: LIBFABRIC runs NIXL over EFA and needs efa.enabled: true; without EFA use UCX (or leave backend empty)." -}}
{{- end -}}

{{- /* Per role: ONE set of checks for both roles */ -}}
{{- $reserved := dict "model" "model.source" "served_model_name" "model.id" "tokenizer" "model.tokenizerSource" "tensor_parallel_size" "<role>.tensorParallelSize" "pipeline_parallel_size" "<role>.pipelineParallelSize" "kv_transfer_config" "kvTransfer" -}}
{{- range $role := splitList " " (include "ray-llm-disagg.roles" $) -}}
{{- $v := index $V $role -}}
{{- $tp := int $v.tensorParallelSize -}}
{{- $pp := int $v.pipelineParallelSize -}}
{{- $g := int $v.gpusPerHost -}}
{{- $itype := include "ray-llm-disagg.instanceType" (dict "root" $ "role" $role) -}}
{{- $known := dict -}}
{{- if $itype -}}{{- $known = default dict (index (default dict $V.instanceTypes) $itype) -}}{{- end -}}
{{- if $gpu -}}
{{- if ne (mod (mul $tp $pp) $g) 0 -}}
{{- $errs = append $errs (printf "%s.gpusPerHost: tensorParallelSize x pipelineParallelSize = %d x %d = %d GPUs per replica is not a multiple of gpusPerHost (%d); a replica must fill whole pods (numOfHosts = TP x PP / gpusPerHost)." $role $tp $pp (mul $tp $pp) $g) -}}
{{- end -}}
{{- if and (hasKey $known "gpus") (gt $g (int $known.gpus)) -}}
{{- $errs = append $errs (printf "%s.gpusPerHost: %d GPUs per pod, but %s.nodeSelector selects %s, which has %d GPUs." $role $g $role $itype (int $known.gpus)) -}}
{{- end -}}
{{- end -}}
{{- if and $V.efa.enabled (hasKey $known "efa") (gt (int $V.efa.devicesPerHost) (int $known.efa)) -}}
{{- $errs = append $errs (printf "efa.devicesPerHost: %d EFA devices per pod, but %s.nodeSelector selects %s, which has %d (pods would stay Pending)." (int $V.efa.devicesPerHost) $role $itype (int $known.efa)) -}}
{{- end -}}
{{- if and $V.efa.enabled $V.efa.hugepages2Mi -}}
{{- $res := default dict $v.resources -}}
{{- $req := merge (dict) (default dict $res.requests) (default dict $res.limits) -}}
{{- if not (or (hasKey $req "memory") (hasKey $req "cpu")) -}}
{{- $errs = append $errs (printf "%s.resources: Kubernetes requires a cpu or memory request next to hugepages-2Mi (efa.hugepages2Mi); set %s.resources.requests.memory." $role $role) -}}
{{- end -}}
{{- end -}}
{{- if and $v.autoscaling.enabled (gt (int $v.autoscaling.minReplicas) (int $v.autoscaling.maxReplicas)) -}}
{{- $errs = append $errs (printf "%s.autoscaling.minReplicas: %d is greater than %s.autoscaling.maxReplicas (%d)." $role (int $v.autoscaling.minReplicas) $role (int $v.autoscaling.maxReplicas)) -}}
{{- end -}}
{{- if hasKey (default dict $v.rayStartParams) "labels" -}}
{{- $errs = append $errs (printf "%s.rayStartParams.labels: KubeRay >= 1.5 rejects rayStartParams labels; the chart sets the role label in the group's labels:, add others in %s.rayLabels." $role $role) -}}
{{- end -}}
{{- if hasKey (default dict $v.rayLabels) $V.placement.roleLabelKey -}}
{{- $errs = append $errs (printf "%s.rayLabels.%s: the role label is set by the chart (placement.roleLabelKey); remove it." $role $V.placement.roleLabelKey) -}}
{{- end -}}
{{- range $k := keys (default dict $v.engineArgs) | sortAlpha -}}
{{- if hasKey $reserved $k -}}
{{- $errs = append $errs (printf "%s.engineArgs.%s: set by the chart; set %s instead." $role $k (replace "<role>" $role (index $reserved $k))) -}}
{{- else if not (regexMatch "^[a-z][a-z0-9_]*$" $k) -}}
{{- $errs = append $errs (printf "%s.engineArgs.%s: vLLM engine arguments are snake_case (e.g. max_model_len), as in vLLM's AsyncEngineArgs." $role $k) -}}
{{- end -}}
{{- end -}}

{{- range $k := keys (default dict $v.rayLabels) | sortAlpha -}}
{{- if not (regexMatch "^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$" $k) -}}
{{- $errs = append $errs (printf "%s.rayLabels.%s: not a valid Kubernetes label key (KubeRay would reject the group)." $role $k) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- /* Disaggregation: what vLLM's NIXL KV transfer supports */ -}}
{{- if ne $V.mode "aggregated" -}}
{{- $p := $V.prefill -}}
{{- $d := $V.decode -}}
{{- if gt (int $d.pipelineParallelSize) 1 -}}
{{- $errs = append $errs (printf "decode.pipelineParallelSize: %d is not supported in disaggregated mode: vLLM's NIXL KV transfer has no decode-side pipeline parallelism (push or pull). Use decode.tensorParallelSize, or mode: aggregated." (int $d.pipelineParallelSize)) -}}
{{- end -}}
{{- if and (gt (int $p.pipelineParallelSize) 1) (ne $V.kvTransfer.connector "NixlPushConnector") -}}
{{- $errs = append $errs (printf "prefill.pipelineParallelSize: %d needs kvTransfer.connector: NixlPushConnector; the pull NixlConnector rejects PP > 1 at its handshake." (int $p.pipelineParallelSize)) -}}
{{- end -}}
{{- if and (gt (int $p.tensorParallelSize) (int $d.tensorParallelSize)) (not $V.kvTransfer.allowPrefillTPGreaterThanDecode) -}}
{{- $errs = append $errs (printf "prefill.tensorParallelSize: %d is greater than decode.tensorParallelSize (%d); NIXL cannot split a prefill TP group across fewer decode ranks. Lower it, or set kvTransfer.allowPrefillTPGreaterThanDecode: true if your vLLM supports it." (int $p.tensorParallelSize) (int $d.tensorParallelSize)) -}}
{{- end -}}
{{- if and (include "ray-llm-disagg.explicitSideChannel" .) (eq (int $p.sideChannelPort) (int $d.sideChannelPort)) -}}
{{- $errs = append $errs (printf "decode.sideChannelPort: %d equals prefill.sideChannelPort; with NixlPushConnector each role needs its own NIXL side-channel port." (int $d.sideChannelPort)) -}}
{{- end -}}
{{- end -}}

{{- if $errs -}}
{{- fail (printf "\n\nray-llm-disagg: invalid values:\n  - %s\n" (join "\n  - " $errs)) -}}
{{- end -}}
{{- end -}}

{{/* =========================================================================================
  Pod pieces
========================================================================================= */}}

{{/* Env for every Ray container: HF token (secretKeyRef, never inlined) and .Values.env. */}}
{{- define "ray-llm-disagg.commonEnv" -}}
{{- with .Values.model.hfTokenSecret.name }}
- name: HF_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $.Values.model.hfTokenSecret.key }}
{{- end }}
{{- with .Values.env }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Env of a worker container ({root, role}): NIXL side channel, EFA, common, role extras. */}}
{{- define "ray-llm-disagg.workerEnv" -}}
{{- $V := .root.Values -}}
{{- $v := index $V .role -}}
{{- if ne $V.mode "aggregated" }}
- name: VLLM_NIXL_SIDE_CHANNEL_HOST
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
{{- if include "ray-llm-disagg.explicitSideChannel" .root }}
- name: VLLM_NIXL_SIDE_CHANNEL_PORT
  value: {{ int $v.sideChannelPort | quote }}
{{- end }}
{{- end }}
{{- if $V.efa.enabled }}
{{- range $k, $val := $V.efa.env }}
- name: {{ $k }}
  value: {{ $val | toString | quote }}
{{- end }}
{{- if not (hasKey $V.efa.env "FI_EFA_USE_HUGE_PAGE") }}
- name: FI_EFA_USE_HUGE_PAGE
  value: {{ ternary "1" "0" (not (empty $V.efa.hugepages2Mi)) | quote }}
{{- end }}
{{- end }}
{{- include "ray-llm-disagg.commonEnv" .root }}
{{- with $v.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Resources of a worker container ({root, role}): user cpu/memory plus GPUs, EFA and hugepages. */}}
{{- define "ray-llm-disagg.workerResources" -}}
{{- $V := .root.Values -}}
{{- $v := index $V .role -}}
{{- $res := deepCopy (default dict $v.resources) -}}
{{- $req := default dict (get $res "requests") -}}
{{- $lim := default dict (get $res "limits") -}}
{{- if eq $V.accelerator "gpu" -}}
{{- $_ := set $req "nvidia.com/gpu" (int $v.gpusPerHost | toString) -}}
{{- $_ := set $lim "nvidia.com/gpu" (int $v.gpusPerHost | toString) -}}
{{- end -}}
{{- if $V.efa.enabled -}}
{{- $_ := set $req "vpc.amazonaws.com/efa" (int $V.efa.devicesPerHost | toString) -}}
{{- $_ := set $lim "vpc.amazonaws.com/efa" (int $V.efa.devicesPerHost | toString) -}}
{{- with $V.efa.hugepages2Mi -}}
{{- $_ := set $req "hugepages-2Mi" . -}}
{{- $_ := set $lim "hugepages-2Mi" . -}}
{{- end -}}
{{- end -}}
{{- $_ := set $res "requests" $req -}}
{{- $_ := set $res "limits" $lim -}}
{{- toYaml $res -}}
{{- end -}}

{{/* Affinity of a worker pod ({root, role}): the user's, plus preferred role anti-affinity and same-zone affinity. */}}
{{- define "ray-llm-disagg.workerAffinity" -}}
{{- $root := .root -}}
{{- $V := $root.Values -}}
{{- $v := index $V .role -}}
{{- $aff := deepCopy (default dict $v.affinity) -}}
{{- if ne $V.mode "aggregated" -}}
{{- $release := dict "app.kubernetes.io/name" (include "ray-llm-disagg.name" $root) "app.kubernetes.io/instance" $root.Release.Name -}}
{{- if $V.scheduling.roleAntiAffinity.enabled -}}
{{- $other := ternary "decode" "prefill" (eq .role "prefill") -}}
{{- $sel := merge (dict $V.placement.roleLabelKey $other) $release -}}
{{- $term := dict "weight" (int $V.scheduling.roleAntiAffinity.weight) "podAffinityTerm" (dict "topologyKey" "kubernetes.io/hostname" "labelSelector" (dict "matchLabels" $sel)) -}}
{{- $paa := default dict (get $aff "podAntiAffinity") -}}
{{- $_ := set $paa "preferredDuringSchedulingIgnoredDuringExecution" (append (default list (get $paa "preferredDuringSchedulingIgnoredDuringExecution")) $term) -}}
{{- $_ := set $aff "podAntiAffinity" $paa -}}
{{- end -}}
{{- if $V.scheduling.sameZone.enabled -}}
{{- $expr := list (dict "key" $V.placement.roleLabelKey "operator" "Exists") -}}
{{- $term := dict "weight" (int $V.scheduling.sameZone.weight) "podAffinityTerm" (dict "topologyKey" $V.scheduling.sameZone.topologyKey "labelSelector" (dict "matchLabels" (deepCopy $release) "matchExpressions" $expr)) -}}
{{- $pa := default dict (get $aff "podAffinity") -}}
{{- $_ := set $pa "preferredDuringSchedulingIgnoredDuringExecution" (append (default list (get $pa "preferredDuringSchedulingIgnoredDuringExecution")) $term) -}}
{{- $_ := set $aff "podAffinity" $pa -}}
{{- end -}}
{{- end -}}
{{- if $aff -}}{{- toYaml $aff -}}{{- end -}}
{{- end -}}

{{/* =========================================================================================
  serveConfigV2: the serve app and its args (validated by serve_app.config.AppConfig)
========================================================================================= */}}
{{- define "ray-llm-disagg.serveArgs" -}}
{{- $V := .Values -}}
{{- $model := dict "id" $V.model.id "source" $V.model.source -}}
{{- with $V.model.tokenizerSource -}}{{- $_ := set $model "tokenizer_source" . -}}{{- end -}}
{{- $args := dict "mode" $V.mode "model" $model "accelerator" $V.accelerator -}}
{{- $explicitPorts := include "ray-llm-disagg.explicitSideChannel" . -}}
{{- range $role := splitList " " (include "ray-llm-disagg.roles" $) -}}
{{- $v := index $V $role -}}
{{- $r := dict "tensor_parallel_size" (int $v.tensorParallelSize) "pipeline_parallel_size" (int $v.pipelineParallelSize) "engine_args" (deepCopy (default dict $v.engineArgs)) "engine_env" (deepCopy (default dict $v.env)) -}}
{{- with $V.acceleratorType -}}{{- $_ := set $r "accelerator_type" . -}}{{- end -}}
{{- if $v.autoscaling.enabled -}}
{{- $_ := set $r "autoscaling" (dict "min_replicas" (int $v.autoscaling.minReplicas) "max_replicas" (int $v.autoscaling.maxReplicas) "target_ongoing_requests" $v.autoscaling.targetOngoingRequests) -}}
{{- else -}}
{{- $_ := set $r "replicas" (int $v.replicas) -}}
{{- end -}}
{{- if $explicitPorts -}}{{- $_ := set $r "side_channel_port" (int $v.sideChannelPort) -}}{{- end -}}
{{- $_ := set $args $role $r -}}
{{- end -}}
{{- if ne $V.mode "aggregated" -}}
{{- $_ := set $args "kv_transfer" (dict "connector" $V.kvTransfer.connector "backend" (include "ray-llm-disagg.kvBackend" .) "buffer_device" (include "ray-llm-disagg.kvBufferDevice" .) "allow_prefill_tp_greater_than_decode" $V.kvTransfer.allowPrefillTPGreaterThanDecode) -}}
{{- $_ := set $args "remote_prefill_min_tokens" (int $V.remotePrefillMinTokens) -}}
{{- end -}}
{{- $placement := dict "role_label_key" $V.placement.roleLabelKey "pin_roles" $V.placement.pinRoles -}}
{{- with $V.placement.ingressLabel -}}{{- $_ := set $placement "frontend_label" . -}}{{- end -}}
{{- $_ := set $args "placement" $placement -}}
{{- $_ := set $args "frontend" (dict "replicas" (int $V.serveIngress.replicas) "num_cpus" $V.serveIngress.numCpus "max_ongoing_requests" (int $V.serveIngress.maxOngoingRequests)) -}}
{{- $_ := set $args "engine_env" (deepCopy (default dict $V.engineEnv)) -}}
{{- $_ := set $args "engine_metrics" $V.engineMetrics -}}
{{- $_ := set $args "timeouts" (dict "first_token_s" $V.timeouts.firstTokenS "between_tokens_s" $V.timeouts.betweenTokensS) -}}
{{- toYaml $args -}}
{{- end -}}

{{- define "ray-llm-disagg.serveConfigV2" -}}
{{- $http := merge (dict "host" "0.0.0.0" "port" (int .Values.serve.port)) (deepCopy (default dict .Values.serve.httpOptions)) -}}
{{- $app := dict "name" .Values.serve.appName "route_prefix" .Values.serve.routePrefix "import_path" .Values.serve.importPath "args" (include "ray-llm-disagg.serveArgs" . | fromYaml) -}}
{{- toYaml (dict "http_options" $http "applications" (list $app)) -}}
{{- end -}}
