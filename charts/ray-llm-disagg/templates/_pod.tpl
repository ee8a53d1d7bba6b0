{{/*
ONE pod template for every Ray group ({root, group}; group is "head", "prefill" or "decode"). The groups
share one values shape (nodeSelector ... sidecars); the head differs only in its ports and container
name, workers add GPUs, EFA, IPC_LOCK, the NIXL side channel and the role's scheduling terms.
Returns the PodTemplateSpec as YAML.
*/}}
{{- define "ray-llm-disagg.podTemplate" -}}
{{- $root := .root -}}
{{- $g := .group -}}
{{- $V := $root.Values -}}
{{- $v := index $V $g -}}
{{- $head := eq $g "head" -}}
{{- $ctx := dict "root" $root "group" $g "role" $g -}}

{{- /* container */ -}}
{{- $c := dict "name" (ternary "ray-head" "ray-worker" $head) "image" (include "ray-llm-disagg.image" $root) "imagePullPolicy" $V.image.pullPolicy -}}
{{- $env := include "ray-llm-disagg.env" $ctx | fromYamlArray -}}
{{- if $env -}}{{- $_ := set $c "env" $env -}}{{- end -}}
{{- with concat (default list $V.envFrom) (default list $v.envFrom) -}}{{- $_ := set $c "envFrom" . -}}{{- end -}}
{{- $_ := set $c "ports" (include "ray-llm-disagg.containerPorts" $ctx | fromYamlArray) -}}
{{- $_ := set $c "resources" (include "ray-llm-disagg.resources" $ctx | fromYaml) -}}
{{- with include "ray-llm-disagg.securityContext" $ctx | fromYaml -}}{{- $_ := set $c "securityContext" . -}}{{- end -}}
{{- $mounts := list (dict "name" "dshm" "mountPath" "/dev/shm") -}}
{{- $vols := list (dict "name" "dshm" "emptyDir" (dict "medium" "Memory" "sizeLimit" $v.shmSizeLimit)) -}}
{{- if $V.auth.apiKeySecret.name -}}
{{- $mounts = append $mounts (dict "name" "api-keys" "mountPath" (include "ray-llm-disagg.apiKeysDir" $root) "readOnly" true) -}}
{{- $vols = append $vols (dict "name" "api-keys" "secret" (dict "secretName" $V.auth.apiKeySecret.name "defaultMode" 292 "items" (list (dict "key" $V.auth.apiKeySecret.key "path" $V.auth.apiKeySecret.key)))) -}}
{{- end -}}
{{- with $V.overflow.apiKeySecret -}}
{{- if .name -}}
{{- $mounts = append $mounts (dict "name" "overflow-key" "mountPath" (include "ray-llm-disagg.overflowKeyDir" $root) "readOnly" true) -}}
{{- $vols = append $vols (dict "name" "overflow-key" "secret" (dict "secretName" .name "defaultMode" 292 "items" (list (dict "key" .key "path" .key)))) -}}
{{- end -}}
{{- end -}}
{{- if (default dict $v.securityContext).readOnlyRootFilesystem -}}
{{- $mounts = append $mounts (dict "name" "tmp" "mountPath" "/tmp") -}}
{{- $vols = append $vols (dict "name" "tmp" "emptyDir" dict) -}}
{{- end -}}
{{- $_ := set $c "volumeMounts" (concat $mounts (default list $v.extraVolumeMounts)) -}}
{{- /* a deleted worker pod drains its Ray node first (drainOnDelete; serve_app/pod/drain.py) */ -}}
{{- if and (not $head) $V.drainOnDelete.enabled -}}
{{- $deadline := sub (include "ray-llm-disagg.graceSeconds" $ctx | int) 10 -}}
{{- $_ := set $c "lifecycle" (dict "preStop" (dict "exec" (dict "command" (list "python" "-m" "serve_app.pod.drain" "--deadline-s" (toString $deadline))))) -}}
{{- end -}}

{{- /* pod */ -}}
{{- $spec := dict "serviceAccountName" (include "ray-llm-disagg.serviceAccountName" $root) -}}
{{- /* Ray never calls the Kubernetes API; only KubeRay's autoscaler sidecar in the head does. */ -}}
{{- $_ := set $spec "automountServiceAccountToken" (and $head (eq (include "ray-llm-disagg.autoscaling" $root) "true")) -}}
{{- with include "ray-llm-disagg.imagePullSecrets" $root | fromYamlArray -}}{{- $_ := set $spec "imagePullSecrets" . -}}{{- end -}}
{{- range $k := list "nodeSelector" "tolerations" "schedulerName" "runtimeClassName" "priorityClassName" -}}
{{- with index $v $k -}}{{- $_ := set $spec $k . -}}{{- end -}}
{{- end -}}
{{- if not (kindIs "invalid" $v.terminationGracePeriodSeconds) -}}{{- $_ := set $spec "terminationGracePeriodSeconds" (int $v.terminationGracePeriodSeconds) -}}{{- end -}}
{{- with $v.podSecurityContext -}}{{- $_ := set $spec "securityContext" . -}}{{- end -}}
{{- with include "ray-llm-disagg.affinity" $ctx | fromYaml -}}{{- $_ := set $spec "affinity" . -}}{{- end -}}
{{- with $v.topologySpreadConstraints -}}
{{- $sel := include "ray-llm-disagg.groupSelector" $ctx | fromJson -}}
{{- $tsc := list -}}
{{- range . -}}
{{- $t := deepCopy . -}}
{{- if not (hasKey $t "labelSelector") -}}{{- $_ := set $t "labelSelector" (dict "matchLabels" $sel) -}}{{- end -}}
{{- $tsc = append $tsc $t -}}
{{- end -}}
{{- $_ := set $spec "topologySpreadConstraints" $tsc -}}
{{- end -}}
{{- with $v.initContainers -}}{{- $_ := set $spec "initContainers" . -}}{{- end -}}
{{- $_ := set $spec "containers" (concat (list $c) (default list $v.sidecars)) -}}
{{- $_ := set $spec "volumes" (concat $vols (default list $v.extraVolumes)) -}}
{{- $meta := dict "labels" (include "ray-llm-disagg.podLabels" $ctx | fromYaml) -}}
{{- with $v.podAnnotations -}}{{- $_ := set $meta "annotations" . -}}{{- end -}}
{{- toYaml (dict "metadata" $meta "spec" $spec) -}}
{{- end -}}

{{/* Image pull secrets: imagePullSecrets plus global.imagePullSecrets, first occurrence of a name wins (YAML list, may be empty). */}}
{{- define "ray-llm-disagg.imagePullSecrets" -}}
{{- $global := default dict .Values.global -}}
{{- $seen := dict -}}
{{- $out := list -}}
{{- range concat (default list .Values.imagePullSecrets) (default list $global.imagePullSecrets) -}}
{{- if not (hasKey $seen .name) -}}
{{- $_ := set $seen .name true -}}
{{- $out = append $out . -}}
{{- end -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/*
Container env of a group ({root, group}; YAML list): on workers the NIXL side channel and EFA's libfabric
env, on every group HF_TOKEN (a secretKeyRef, never inlined) and Serve's high-throughput mode
(serve.highThroughput), then extraEnv and the group's extraEnv
(the group's entry replaces a same-named global one: no duplicate names).
*/}}
{{- define "ray-llm-disagg.env" -}}
{{- $V := .root.Values -}}
{{- $v := index $V .group -}}
{{- $env := list -}}
{{- if ne .group "head" -}}
{{- if ne $V.mode "aggregated" -}}
{{- $env = append $env (dict "name" "VLLM_NIXL_SIDE_CHANNEL_HOST" "valueFrom" (dict "fieldRef" (dict "fieldPath" "status.podIP"))) -}}
{{- if include "ray-llm-disagg.explicitSideChannel" .root -}}
{{- $env = append $env (dict "name" "VLLM_NIXL_SIDE_CHANNEL_PORT" "value" (int $v.sideChannelPort | toString)) -}}
{{- end -}}
{{- end -}}
{{- if $V.efa.enabled -}}
{{- range $k := keys (default dict $V.efa.env) | sortAlpha -}}
{{- $env = append $env (dict "name" $k "value" (index $V.efa.env $k | toString)) -}}
{{- end -}}
{{- if not (hasKey (default dict $V.efa.env) "FI_EFA_USE_HUGE_PAGE") -}}
{{- $env = append $env (dict "name" "FI_EFA_USE_HUGE_PAGE" "value" (ternary "1" "0" (not (empty $V.efa.hugepages2Mi)))) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- with $V.model.hfTokenSecret.name -}}
{{- $env = append $env (dict "name" "HF_TOKEN" "valueFrom" (dict "secretKeyRef" (dict "name" . "key" $V.model.hfTokenSecret.key))) -}}
{{- end -}}
{{- /* Serve's own HTTP servers (each node's proxy, HAProxy's backup; the ingress replicas) run the app's edge
middlewares: a request the proxy holds for an app with no running ingress replica gets a 503 naming the role */ -}}
{{- $env = append $env (dict "name" "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH" "value" "serve_app.frontend.edge:proxy_middlewares") -}}
{{- if $V.serve.highThroughput -}}
{{- /* every Ray process reads these at start: the controller, the proxies (HAProxy), every replica */ -}}
{{- $env = append $env (dict "name" "RAY_SERVE_ENABLE_HA_PROXY" "value" "1") -}}
{{- $env = append $env (dict "name" "RAY_SERVE_THROUGHPUT_OPTIMIZED" "value" "1") -}}
{{- /* HAProxy's connect timeout and health checks: a frontend replica whose pod vanished answers no SYN */ -}}
{{- $env = append $env (dict "name" "RAY_SERVE_HAPROXY_TIMEOUT_CONNECT_S" "value" (int $V.serve.haproxyConnectTimeoutS | toString)) -}}
{{- $env = append $env (dict "name" "RAY_SERVE_HAPROXY_HEALTH_CHECK_INTER" "value" (printf "%ds" (int $V.serve.haproxyHealthCheckIntervalS))) -}}
{{- /* replay (once by default) a request whose frontend replica died before answering anything */ -}}
{{- $env = append $env (dict "name" "RAY_SERVE_HAPROXY_RETRY_ON" "value" $V.serve.haproxyRetryOn) -}}
{{- $env = append $env (dict "name" "RAY_SERVE_HAPROXY_RETRIES" "value" (int $V.serve.haproxyRetries | toString)) -}}
{{- /* one refused connection marks a replica DOWN (Ray's default 3), so the retry goes elsewhere or to the
node's Serve proxy (503 naming the role) instead of the same dead replica and HAProxy's plain-text 500 */ -}}
{{- $env = append $env (dict "name" "RAY_SERVE_HAPROXY_OBSERVE_ERROR_LIMIT" "value" "1") -}}
{{- end -}}
{{- $user := list -}}
{{- $index := dict -}}
{{- range $e := concat (default list $V.extraEnv) (default list $v.extraEnv) -}}
{{- if hasKey $index $e.name -}}
{{- $i := int (index $index $e.name) -}}
{{- $next := list -}}
{{- range $j, $old := $user -}}{{- $next = append $next (ternary $e $old (eq $j $i)) -}}{{- end -}}
{{- $user = $next -}}
{{- else -}}
{{- $_ := set $index $e.name (len $user) -}}
{{- $user = append $user $e -}}
{{- end -}}
{{- end -}}
{{- toYaml (concat $env $user) -}}
{{- end -}}

{{/* Container ports of a group ({root, group}; YAML list): Ray's named ports KubeRay and the NetworkPolicy use. */}}
{{- define "ray-llm-disagg.containerPorts" -}}
{{- $V := .root.Values -}}
{{- $p := include "ray-llm-disagg.rayPorts" . | fromJson -}}
{{- $out := list -}}
{{- if eq .group "head" -}}
{{- $out = append $out (dict "name" "gcs-server" "containerPort" (int (index $p "gcs-server"))) -}}
{{- $out = append $out (dict "name" "dashboard" "containerPort" (int $p.dashboard)) -}}
{{- $out = append $out (dict "name" "client" "containerPort" (int $p.client)) -}}
{{- $out = append $out (dict "name" "serve" "containerPort" (int $V.serve.port)) -}}
{{- end -}}
{{- $out = append $out (dict "name" "metrics" "containerPort" (int $p.metrics)) -}}
{{- if and (ne .group "head") (include "ray-llm-disagg.explicitSideChannel" .root) -}}
{{- $out = append $out (dict "name" "nixl-side" "containerPort" (int (index $V .group).sideChannelPort) "protocol" "TCP") -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/* Resources of a group's Ray container ({root, group}; YAML): the user's, plus on workers GPUs, EFA devices and hugepages. */}}
{{- define "ray-llm-disagg.resources" -}}
{{- $V := .root.Values -}}
{{- $v := index $V .group -}}
{{- $res := deepCopy (default dict $v.resources) -}}
{{- if ne .group "head" -}}
{{- $req := default dict (get $res "requests") -}}
{{- $lim := default dict (get $res "limits") -}}
{{- $add := dict -}}
{{- if eq $V.accelerator "gpu" -}}{{- $_ := set $add "nvidia.com/gpu" (int $v.gpusPerHost | toString) -}}{{- end -}}
{{- if $V.efa.enabled -}}
{{- with include "ray-llm-disagg.efaDevices" (dict "root" .root "role" .group) -}}{{- $_ := set $add "vpc.amazonaws.com/efa" . -}}{{- end -}}
{{- with $V.efa.hugepages2Mi -}}{{- $_ := set $add "hugepages-2Mi" . -}}{{- end -}}
{{- end -}}
{{- range $k, $val := $add -}}{{- $_ := set $req $k $val -}}{{- $_ := set $lim $k $val -}}{{- end -}}
{{- $_ := set $res "requests" $req -}}
{{- $_ := set $res "limits" $lim -}}
{{- end -}}
{{- toYaml $res -}}
{{- end -}}

{{/* Security context of a group's Ray container ({root, group}; YAML): the user's, plus on workers IPC_LOCK (ipcLock;
null: with EFA only) and privileged (efa.privileged). */}}
{{- define "ray-llm-disagg.securityContext" -}}
{{- $V := .root.Values -}}
{{- $sc := deepCopy (default dict (index $V .group).securityContext) -}}
{{- if ne .group "head" -}}
{{- if and $V.efa.enabled $V.efa.privileged -}}{{- $_ := set $sc "privileged" true -}}{{- end -}}
{{- $ipcLock := $V.ipcLock -}}
{{- if kindIs "invalid" $ipcLock -}}{{- $ipcLock = $V.efa.enabled -}}{{- end -}}
{{- if $ipcLock -}}
{{- $caps := default dict (get $sc "capabilities") -}}
{{- $add := default list (get $caps "add") -}}
{{- if not (has "IPC_LOCK" $add) -}}{{- $add = append $add "IPC_LOCK" -}}{{- end -}}
{{- $_ := set $caps "add" $add -}}
{{- $_ := set $sc "capabilities" $caps -}}
{{- end -}}
{{- end -}}
{{- if $sc -}}{{- toYaml $sc -}}{{- end -}}
{{- end -}}

{{/*
Affinity of a group's pods ({root, group}; YAML): the user's, plus on workers in disaggregated mode the
role anti-affinity (preferred: prefill and decode pods of this release on different nodes), and the
same-zone term over this release's worker pods: REQUIRED with EFA in any mode (EFA does not cross
availability zones: neither the KV transfer nor a multi-host replica's NCCL traffic), preferred otherwise
in disaggregated mode.
*/}}
{{- define "ray-llm-disagg.affinity" -}}
{{- $root := .root -}}
{{- $V := $root.Values -}}
{{- $aff := deepCopy (default dict (index $V .group).affinity) -}}
{{- $disagg := ne $V.mode "aggregated" -}}
{{- if and (ne .group "head") (or $disagg $V.efa.enabled) -}}
{{- $release := include "ray-llm-disagg.selectorLabels" $root | fromYaml -}}
{{- $S := $V.scheduling -}}
{{- if and $disagg $S.roleAntiAffinity.enabled -}}
{{- $other := ternary "decode" "prefill" (eq .group "prefill") -}}
{{- $sel := merge (dict $V.placement.roleLabelKey $other) $release -}}
{{- $term := dict "weight" (int $S.roleAntiAffinity.weight) "podAffinityTerm" (dict "topologyKey" "kubernetes.io/hostname" "labelSelector" (dict "matchLabels" $sel)) -}}
{{- $paa := default dict (get $aff "podAntiAffinity") -}}
{{- $_ := set $paa "preferredDuringSchedulingIgnoredDuringExecution" (append (default list (get $paa "preferredDuringSchedulingIgnoredDuringExecution")) $term) -}}
{{- $_ := set $aff "podAntiAffinity" $paa -}}
{{- end -}}
{{- if $S.sameZone.enabled -}}
{{- $zone := dict "topologyKey" $S.sameZone.topologyKey "labelSelector" (dict "matchLabels" (deepCopy $release) "matchExpressions" (list (dict "key" $V.placement.roleLabelKey "operator" "Exists"))) -}}
{{- $pa := default dict (get $aff "podAffinity") -}}
{{- if $V.efa.enabled -}}
{{- $_ := set $pa "requiredDuringSchedulingIgnoredDuringExecution" (append (default list (get $pa "requiredDuringSchedulingIgnoredDuringExecution")) $zone) -}}
{{- else -}}
{{- $_ := set $pa "preferredDuringSchedulingIgnoredDuringExecution" (append (default list (get $pa "preferredDuringSchedulingIgnoredDuringExecution")) (dict "weight" (int $S.sameZone.weight) "podAffinityTerm" $zone)) -}}
{{- end -}}
{{- $_ := set $aff "podAffinity" $pa -}}
{{- end -}}
{{- end -}}
{{- if $aff -}}{{- toYaml $aff -}}{{- end -}}
{{- end -}}

{{/* Seconds a group's pods get to stop ({root, group}): terminationGracePeriodSeconds, or Kubernetes' 30. */}}
{{- define "ray-llm-disagg.graceSeconds" -}}
{{- $v := index .root.Values .group -}}
{{- ternary 30 (int $v.terminationGracePeriodSeconds) (kindIs "invalid" $v.terminationGracePeriodSeconds) -}}
{{- end -}}
