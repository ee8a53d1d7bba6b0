{{/* Settings derived from several values; one place for each rule the templates share. */}}

{{/* Roles rendered as worker groups, space separated: aggregated mode serves from decode only. */}}
{{- define "ray-llm-disagg.roles" -}}
{{- if eq .Values.mode "aggregated" -}}decode{{- else -}}prefill decode{{- end -}}
{{- end -}}

{{/* Every Ray group (head first), space separated. */}}
{{- define "ray-llm-disagg.groups" -}}
head {{ include "ray-llm-disagg.roles" . }}
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
{{- $on := false -}}
{{- range $role := splitList " " (include "ray-llm-disagg.roles" $) -}}
{{- if (index $.Values $role).autoscaling.enabled -}}{{- $on = true -}}{{- end -}}
{{- end -}}
{{- if $on -}}true{{- end -}}
{{- end -}}

{{/* Pods per replica of a role ({root, role}): TP x PP / gpusPerHost on GPU, 1 on CPU. */}}
{{- define "ray-llm-disagg.numOfHosts" -}}
{{- $v := index .root.Values .role -}}
{{- if eq .root.Values.accelerator "gpu" -}}
{{- div (mul (int $v.tensorParallelSize) (int $v.pipelineParallelSize)) (max 1 (int $v.gpusPerHost)) -}}
{{- else -}}1{{- end -}}
{{- end -}}

{{/* Ray pods that can take a frontend replica (JSON {n, why}): the workers, as many as their autoscaling allows,
and the head when a replica needs no CPU (the head starts with num-cpus 0). */}}
{{- define "ray-llm-disagg.frontendHolders" -}}
{{- $V := .Values -}}
{{- $zero := eq (float64 $V.frontend.numCpus) 0.0 -}}
{{- $n := ternary 1 0 $zero -}}
{{- $why := list -}}
{{- range $role := splitList " " (include "ray-llm-disagg.roles" .) -}}
{{- $v := index $V $role -}}
{{- $pods := mul (ternary (int $v.autoscaling.maxReplicas) (int $v.replicas) (and $v.autoscaling.enabled true)) (int (include "ray-llm-disagg.numOfHosts" (dict "root" $ "role" $role))) -}}
{{- $n = add $n $pods -}}
{{- $why = append $why (printf "%s %d" $role $pods) -}}
{{- end -}}
{{- $why = append $why (ternary "the head" "not the head: frontend.numCpus > 0" $zero) -}}
{{- toJson (dict "n" $n "why" (join ", " $why)) -}}
{{- end -}}

{{/* frontend.max_replicas_per_node for the app's args: the value, or with null 1 where the pods can hold every
replica that way (else no limit). */}}
{{- define "ray-llm-disagg.frontendPerNode" -}}
{{- $fe := .Values.frontend -}}
{{- if not (kindIs "invalid" $fe.maxReplicasPerNode) -}}{{- int $fe.maxReplicasPerNode -}}
{{- else if and (not $fe.directStreaming) (le (int $fe.replicas) (int (include "ray-llm-disagg.frontendHolders" . | fromJson).n)) -}}1
{{- end -}}
{{- end -}}

{{/* Pods a role runs at its floor ({root, role}): (min)replicas x numOfHosts. */}}
{{- define "ray-llm-disagg.podsFloor" -}}
{{- $v := index .root.Values .role -}}
{{- $replicas := ternary (int $v.autoscaling.minReplicas) (int $v.replicas) (and $v.autoscaling.enabled true) -}}
{{- mul $replicas (int (include "ray-llm-disagg.numOfHosts" .)) -}}
{{- end -}}

{{/*
The instance types a role's pods can land on ({root, role}; JSON):
  types    from the nodeSelector (node.kubernetes.io/instance-type, or the beta key), else from the
           required node affinity when EVERY nodeSelectorTerm has an `instance-type In [...]` expression
           (terms are ORed); empty when the pool does not pin the type (e.g. a Karpenter NodePool name only)
  unknown  those of them missing from .Values.instanceTypes
  gpus/efa the smallest count over the types (a pod must fit on any of them); absent when unknown
  acc      their Ray accelerator type when they all agree; mixedAcc when they do not
*/}}
{{- define "ray-llm-disagg.instanceInfo" -}}
{{- $v := index .root.Values .role -}}
{{- $keys := list "node.kubernetes.io/instance-type" "beta.kubernetes.io/instance-type" -}}
{{- $ns := default dict $v.nodeSelector -}}
{{- $types := list -}}
{{- range $keys -}}{{- if and (not $types) (hasKey $ns .) -}}{{- $types = list (index $ns .) -}}{{- end -}}{{- end -}}
{{- if not $types -}}
{{- $na := (default dict (default dict $v.affinity).nodeAffinity) -}}
{{- $req := default dict (index $na "requiredDuringSchedulingIgnoredDuringExecution") -}}
{{- $terms := default list $req.nodeSelectorTerms -}}
{{- $all := true -}}
{{- $found := list -}}
{{- range $t := $terms -}}
{{- $termTypes := list -}}
{{- range $e := default list $t.matchExpressions -}}
{{- if and (has $e.key $keys) (eq $e.operator "In") -}}{{- $termTypes = concat $termTypes (default list $e.values) -}}{{- end -}}
{{- end -}}
{{- if $termTypes -}}{{- $found = concat $found $termTypes -}}{{- else -}}{{- $all = false -}}{{- end -}}
{{- end -}}
{{- if and $terms $all -}}{{- $types = uniq $found -}}{{- end -}}
{{- end -}}
{{- $table := default dict .root.Values.instanceTypes -}}
{{- $out := dict "types" $types "unknown" list -}}
{{- $accs := list -}}
{{- range $t := $types -}}
{{- $known := index $table $t -}}
{{- if not $known -}}
{{- $_ := set $out "unknown" (append $out.unknown $t) -}}
{{- else -}}
{{- if or (not (hasKey $out "gpus")) (lt (int $known.gpus) (int $out.gpus)) -}}{{- $_ := set $out "gpus" (int $known.gpus) -}}{{- end -}}
{{- if or (not (hasKey $out "efa")) (lt (int $known.efa) (int $out.efa)) -}}{{- $_ := set $out "efa" (int $known.efa) -}}{{- end -}}
{{- $accs = append $accs (default "" $known.acceleratorType) -}}
{{- end -}}
{{- end -}}
{{- if $out.unknown -}}{{- $_ := unset $out "gpus" -}}{{- $_ := unset $out "efa" -}}{{- $accs = list -}}{{- end -}}
{{- $accs = uniq $accs -}}
{{- if eq (len $accs) 1 -}}{{- $_ := set $out "acc" (first $accs) -}}{{- else if gt (len $accs) 1 -}}{{- $_ := set $out "mixedAcc" $accs -}}{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* EFA devices per pod of a role ({root, role}): explicit, else the instance type's count in proportion to
gpusPerHost (at least 1); empty when neither is known (validate then fails with efa.enabled). */}}
{{- define "ray-llm-disagg.efaDevices" -}}
{{- $v := index .root.Values .role -}}
{{- if not (kindIs "invalid" $v.efaDevicesPerHost) -}}
{{- int $v.efaDevicesPerHost -}}
{{- else -}}
{{- $info := include "ray-llm-disagg.instanceInfo" . | fromJson -}}
{{- if and (hasKey $info "efa") (gt (int $info.gpus) 0) -}}
{{- max 1 (div (mul (int $info.efa) (int $v.gpusPerHost)) (int $info.gpus)) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Ray accelerator type of a role ({root, role}): explicit (passed as is), else on GPU derived from its instance type; empty when unknown. */}}
{{- define "ray-llm-disagg.acceleratorType" -}}
{{- $v := index .root.Values .role -}}
{{- if $v.acceleratorType -}}{{ $v.acceleratorType }}
{{- else if eq .root.Values.accelerator "gpu" -}}{{- (include "ray-llm-disagg.instanceInfo" . | fromJson).acc | default "" -}}
{{- end -}}
{{- end -}}

{{/*
Ray's ports on a group's pods ({root, group}; JSON name -> port), from its rayStartParams or Ray/KubeRay's
defaults; what the NetworkPolicy opens and what serve.port / sideChannelPort must not collide with.
*/}}
{{- define "ray-llm-disagg.rayPorts" -}}
{{- $p := default dict (index .root.Values .group).rayStartParams -}}
{{- $out := dict "metrics" (int (default "8080" (index $p "metrics-export-port"))) "dashboard-agent" (int (default "52365" (index $p "dashboard-agent-listen-port"))) "object-manager" (int (default "8076" (index $p "object-manager-port"))) -}}
{{- if eq .group "head" -}}
{{- $_ := set $out "gcs-server" (int (default "6379" (index $p "port"))) -}}
{{- $_ := set $out "dashboard" (int (default "8265" (index $p "dashboard-port"))) -}}
{{- $_ := set $out "client" (int (default "10001" (index $p "ray-client-server-port"))) -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* Ray's worker port range on a group ({root, group}; JSON [min, max]). */}}
{{- define "ray-llm-disagg.workerPortRange" -}}
{{- $p := default dict (index .root.Values .group).rayStartParams -}}
{{- list (int (default "10002" (index $p "min-worker-port"))) (int (default "19999" (index $p "max-worker-port"))) | toJson -}}
{{- end -}}

{{/* Idle timeout (s) the chart gives a load balancer in front of the app: above the longest silence the app allows. */}}
{{- define "ray-llm-disagg.lbIdleTimeout" -}}
{{- add (ceil (maxf .Values.timeouts.firstTokenS .Values.timeouts.betweenTokensS)) 30 | int -}}
{{- end -}}
