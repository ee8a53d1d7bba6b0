{{/*
Checks a JSON schema cannot express (values.schema.json carries the rest, with their reasons, so that
`helm lint` fails on those too). Every message names the key and the reason; all problems are reported
at once. Note: `helm lint` turns a template `fail` into an [INFO] line (Helm's lint mode), so these
checks fail `helm install/upgrade/template` but not `helm lint`/`ct lint` (see the chart README, "Checks").
*/}}
{{- define "ray-llm-disagg.validate" -}}
{{- $V := .Values -}}
{{- $errs := list -}}
{{- $supported := index .Chart.Annotations "ray-llm-disagg.io/kuberay-supported" -}}
{{- $gpu := eq $V.accelerator "gpu" -}}
{{- $disagg := ne $V.mode "aggregated" -}}
{{- $roles := splitList " " (include "ray-llm-disagg.roles" .) -}}
{{- $groups := splitList " " (include "ray-llm-disagg.groups" .) -}}

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

{{- /* RayService name (from the release name unless fullnameOverride; the schema checks the override) */ -}}
{{- $name := include "ray-llm-disagg.fullname" . -}}
{{- if gt (len $name) 47 -}}
{{- $errs = append $errs (printf "fullnameOverride: the RayService name %q (from the release name and fullnameOverride/nameOverride) is %d characters; KubeRay allows at most 47 (it appends a 6-character suffix to the RayCluster name, limit 53). Use a shorter release name or set fullnameOverride." $name (len $name)) -}}
{{- end -}}
{{- if not (regexMatch "^[a-z]([-a-z0-9]*[a-z0-9])?$" $name) -}}
{{- $errs = append $errs (printf "fullnameOverride: the RayService name %q must be a DNS-1035 label (lower case letters, digits and '-', starting with a letter); use another release name or set fullnameOverride." $name) -}}
{{- end -}}

{{- /* The role label key is configurable: the schema can only protect its default */ -}}
{{- $roleKey := $V.placement.roleLabelKey -}}
{{- $userLabels := include "ray-llm-disagg.userLabels" . | fromJson -}}
{{- if hasKey $userLabels $roleKey -}}
{{- $errs = append $errs (printf "commonLabels.%s: the role label the chart sets on worker pods (placement.roleLabelKey); remove it." $roleKey) -}}
{{- end -}}

{{- /* Per group (head and roles): ONE set of pod checks */ -}}
{{- $apiKeys := and $V.auth.apiKeySecret.name true -}}
{{- $overflowKey := and $V.overflow.apiKeySecret.name true -}}
{{- range $g := $groups -}}
{{- $v := index $V $g -}}
{{- $ctx := dict "root" $ "group" $g -}}
{{- if hasKey (default dict $v.podLabels) $roleKey -}}
{{- $errs = append $errs (printf "%s.podLabels.%s: the role label the chart sets (placement.roleLabelKey); remove it." $g $roleKey) -}}
{{- end -}}
{{- range $k, $val := default dict $v.rayLabels -}}
{{- if eq $k $roleKey -}}
{{- $errs = append $errs (printf "%s.rayLabels.%s: the role label is set by the chart (placement.roleLabelKey); remove it." $g $k) -}}
{{- else if and (hasKey (default dict $v.podLabels) $k) (ne (toString (index $v.podLabels $k)) (toString $val)) -}}
{{- $errs = append $errs (printf "%s.podLabels.%s: KubeRay also puts %s.rayLabels.%s=%s on the pods and it would win over %s; use one of them." $g $k $g $k $val (index $v.podLabels $k)) -}}
{{- end -}}
{{- end -}}
{{- /* names the chart owns in the pod */ -}}
{{- $vols := list "dshm" -}}
{{- $mounts := list "/dev/shm" -}}
{{- if $apiKeys -}}{{- $vols = append $vols "api-keys" -}}{{- $mounts = append $mounts (include "ray-llm-disagg.apiKeysDir" $) -}}{{- end -}}
{{- if $overflowKey -}}{{- $vols = append $vols "overflow-key" -}}{{- $mounts = append $mounts (include "ray-llm-disagg.overflowKeyDir" $) -}}{{- end -}}
{{- if (default dict $v.securityContext).readOnlyRootFilesystem -}}{{- $vols = append $vols "tmp" -}}{{- $mounts = append $mounts "/tmp" -}}{{- end -}}
{{- range $i, $vol := default list $v.extraVolumes -}}
{{- if has $vol.name $vols -}}
{{- $errs = append $errs (printf "%s.extraVolumes[%d].name: %q is a volume the chart adds (%s); use another name." $g $i $vol.name (join ", " $vols)) -}}
{{- end -}}
{{- end -}}
{{- range $i, $m := default list $v.extraVolumeMounts -}}
{{- if has (trimSuffix "/" (toString $m.mountPath)) $mounts -}}
{{- $errs = append $errs (printf "%s.extraVolumeMounts[%d].mountPath: %s is mounted by the chart (%s); mount elsewhere." $g $i $m.mountPath (join ", " $mounts)) -}}
{{- end -}}
{{- end -}}
{{- $containers := list (ternary "ray-head" "ray-worker" (eq $g "head")) -}}
{{- range $kind := list "initContainers" "sidecars" -}}
{{- range $i, $c := default list (index $v $kind) -}}
{{- if has $c.name $containers -}}
{{- $errs = append $errs (printf "%s.%s[%d].name: %q is already a container of the pod (names must be unique across init and regular containers)." $g $kind $i $c.name) -}}
{{- end -}}
{{- $containers = append $containers $c.name -}}
{{- if and (eq $kind "initContainers") (eq (toString $c.restartPolicy) "Always") (semverCompare "<1.29.0-0" $.Capabilities.KubeVersion.Version) -}}
{{- $errs = append $errs (printf "%s.initContainers[%d].restartPolicy: Always (a native sidecar) needs Kubernetes >= 1.29; this cluster is %s. Use %s.sidecars instead." $g $i $.Capabilities.KubeVersion.Version $g) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- /* container env the chart sets must not be set twice */ -}}
{{- $owned := list -}}
{{- if ne $g "head" -}}
{{- if $disagg -}}{{- $owned = concat $owned (list "VLLM_NIXL_SIDE_CHANNEL_HOST" "VLLM_NIXL_SIDE_CHANNEL_PORT") -}}{{- end -}}
{{- if $V.efa.enabled -}}{{- $owned = concat $owned (keys (default dict $V.efa.env)) (list "FI_EFA_USE_HUGE_PAGE") -}}{{- end -}}
{{- end -}}
{{- range $where := list "extraEnv" (printf "%s.extraEnv" $g) -}}
{{- $list := ternary $V.extraEnv $v.extraEnv (eq $where "extraEnv") -}}
{{- range $i, $e := default list $list -}}
{{- if has $e.name $owned -}}
{{- $errs = append $errs (printf "%s[%d]: %s is set by the chart on %s pods (NIXL side channel, or efa.env with efa.enabled); change it there instead." $where $i $e.name $g) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- /* security context: what the chart adds must fit what the user set */ -}}
{{- if ne $g "head" -}}
{{- $sc := default dict $v.securityContext -}}
{{- $privileged := and $V.efa.enabled $V.efa.privileged -}}
{{- if and $privileged (hasKey $sc "privileged") (not $sc.privileged) -}}
{{- $errs = append $errs (printf "%s.securityContext.privileged: false, but efa.privileged makes EFA workers privileged; drop one of them." $g) -}}
{{- end -}}
{{- if and (or $privileged $sc.privileged) (hasKey $sc "allowPrivilegeEscalation") (not $sc.allowPrivilegeEscalation) -}}
{{- $errs = append $errs (printf "%s.securityContext.allowPrivilegeEscalation: false cannot go with a privileged container (efa.privileged); the API server rejects the pod." $g) -}}
{{- end -}}
{{- end -}}
{{- /* Ray's own ports on this group vs the ports the chart adds */ -}}
{{- $ports := include "ray-llm-disagg.rayPorts" $ctx | fromJson -}}
{{- $range := include "ray-llm-disagg.workerPortRange" $ctx | fromJsonArray -}}
{{- $mine := dict "serve.port" (int $V.serve.port) -}}
{{- if and (ne $g "head") $disagg -}}{{- $_ := set $mine (printf "%s.sideChannelPort" $g) (int $v.sideChannelPort) -}}{{- end -}}
{{- range $key, $port := $mine -}}
{{- range $pname, $p := $ports -}}
{{- if eq (int $p) (int $port) -}}
{{- $errs = append $errs (printf "%s: %d is Ray's %s port on the %s pods (%s.rayStartParams or Ray's default); use another port." $key (int $port) $pname $g $g) -}}
{{- end -}}
{{- end -}}
{{- if and (ge (int $port) (int (index $range 0))) (le (int $port) (int (index $range 1))) -}}
{{- $errs = append $errs (printf "%s: %d is inside Ray's worker port range %d-%d on the %s pods (min-worker-port/max-worker-port); use a port outside it." $key (int $port) (int (index $range 0)) (int (index $range 1)) $g) -}}
{{- end -}}
{{- end -}}
{{- if and (ne $g "head") $disagg (eq (int $v.sideChannelPort) (int $V.serve.port)) -}}
{{- $errs = append $errs (printf "%s.sideChannelPort: %d is serve.port; Serve proxies listen on it on every pod." $g (int $v.sideChannelPort)) -}}
{{- end -}}
{{- end -}}

{{- /* Per role: ONE set of checks for both roles */ -}}
{{- range $role := $roles -}}
{{- $v := index $V $role -}}
{{- $ctx := dict "root" $ "role" $role -}}
{{- $tp := int $v.tensorParallelSize -}}
{{- $pp := int $v.pipelineParallelSize -}}
{{- $g := int $v.gpusPerHost -}}
{{- $info := include "ray-llm-disagg.instanceInfo" $ctx | fromJson -}}
{{- $where := "" -}}
{{- if $info.types -}}{{- $where = printf "%s.nodeSelector/affinity select %s" $role (join ", " $info.types) -}}{{- end -}}
{{- if $gpu -}}
{{- if ne (mod (mul $tp $pp) $g) 0 -}}
{{- $errs = append $errs (printf "%s.gpusPerHost: tensorParallelSize x pipelineParallelSize = %d x %d = %d GPUs per replica is not a multiple of gpusPerHost (%d); a replica must fill whole pods (numOfHosts = TP x PP / gpusPerHost)." $role $tp $pp (mul $tp $pp) $g) -}}
{{- end -}}
{{- if and (hasKey $info "gpus") (gt $g (int $info.gpus)) -}}
{{- $errs = append $errs (printf "%s.gpusPerHost: %d GPUs per pod, but %s, with %d GPUs per node." $role $g $where (int $info.gpus)) -}}
{{- end -}}
{{- /* accelerator type: per role, derived from the instance type where known */ -}}
{{- if $v.acceleratorType -}}
{{- if and $info.acc (ne $info.acc $v.acceleratorType) -}}
{{- $errs = append $errs (printf "%s.acceleratorType: %s, but %s (%s GPUs); Ray would never place the engines. Leave it empty to derive it." $role $v.acceleratorType $where $info.acc) -}}
{{- else if $info.mixedAcc -}}
{{- $errs = append $errs (printf "%s.acceleratorType: %s, but %s, which mix %s GPUs; pods of the other types would never get engines. Pin one instance type, or leave it empty." $role $v.acceleratorType $where (join "/" $info.mixedAcc)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- /* EFA: per role, derived from the instance type where known, required where not */ -}}
{{- if $V.efa.enabled -}}
{{- $devices := include "ray-llm-disagg.efaDevices" $ctx -}}
{{- if not $devices -}}
{{- if $info.unknown -}}
{{- $errs = append $errs (printf "%s.efaDevicesPerHost: required with efa.enabled: %s.nodeSelector/affinity name %s, which instanceTypes does not list. Set the EFA devices per pod (p5/p5e 32 per 8 GPUs, p5en 16, p4d/p4de 4, p6-b200 8), or add the type to instanceTypes." $role $role (join ", " $info.unknown)) -}}
{{- else -}}
{{- $errs = append $errs (printf "%s.efaDevicesPerHost: required with efa.enabled: %s.nodeSelector/affinity do not pin an instance type (e.g. a Karpenter NodePool name only), so the chart cannot derive the EFA devices per pod. Set it (p5/p5e 32 per 8 GPUs, p5en 16, p4d/p4de 4, p6-b200 8), or add node.kubernetes.io/instance-type to %s.nodeSelector." $role $role $role) -}}
{{- end -}}
{{- else if and (hasKey $info "efa") (gt (int $devices) (int $info.efa)) -}}
{{- $errs = append $errs (printf "%s.efaDevicesPerHost: %d EFA devices per pod, but %s, with %d per node (pods would stay Pending)." $role (int $devices) $where (int $info.efa)) -}}
{{- end -}}
{{- if $V.efa.hugepages2Mi -}}
{{- $res := default dict $v.resources -}}
{{- $req := merge (dict) (default dict $res.requests) (default dict $res.limits) -}}
{{- if not (or (hasKey $req "memory") (hasKey $req "cpu")) -}}
{{- $errs = append $errs (printf "%s.resources: Kubernetes requires a cpu or memory request next to hugepages-2Mi (efa.hugepages2Mi); set %s.resources.requests.memory." $role $role) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and (lt (float64 $v.gpuFraction) 1.0) (gt (mul $tp $pp) 1) -}}
{{- $errs = append $errs (printf "%s.gpuFraction: %v shares a GPU between engines, which needs one worker per engine; tensorParallelSize x pipelineParallelSize is %d." $role $v.gpuFraction (mul $tp $pp)) -}}
{{- end -}}
{{- if and $V.drainOnDelete.enabled (lt (include "ray-llm-disagg.graceSeconds" (dict "root" $ "group" $role) | int) 20) -}}
{{- $errs = append $errs (printf "%s.terminationGracePeriodSeconds: %d s is too short for drainOnDelete (its preStop hook gets the grace minus 10 s for `ray stop`); give at least 20, or set drainOnDelete.enabled: false." $role (include "ray-llm-disagg.graceSeconds" (dict "root" $ "group" $role) | int)) -}}
{{- end -}}
{{- if and $v.autoscaling.enabled (gt (int $v.autoscaling.minReplicas) (int $v.autoscaling.maxReplicas)) -}}
{{- $errs = append $errs (printf "%s.autoscaling.minReplicas: %d is greater than %s.autoscaling.maxReplicas (%d)." $role (int $v.autoscaling.minReplicas) $role (int $v.autoscaling.maxReplicas)) -}}
{{- end -}}
{{- end -}}

{{- /* Coupled autoscaling: the prefill:decode ratio bounds must be reachable within the roles' bounds */ -}}
{{- $ratio := $V.autoscaling.ratio -}}
{{- if and $ratio (not (kindIs "invalid" $ratio.min)) (not (kindIs "invalid" $ratio.max)) (gt (float64 $ratio.min) (float64 $ratio.max)) -}}
{{- $errs = append $errs (printf "autoscaling.ratio.min: %v is greater than autoscaling.ratio.max (%v)." $ratio.min $ratio.max) -}}
{{- end -}}
{{- if and $disagg (eq (toString $V.autoscaling.mode) "coupled") $V.prefill.autoscaling.enabled $V.decode.autoscaling.enabled -}}
{{- $pa := $V.prefill.autoscaling -}}
{{- $da := $V.decode.autoscaling -}}
{{- if and (not (kindIs "invalid" $ratio.max)) (gt (float64 $pa.minReplicas) (mulf (float64 $ratio.max) (float64 $da.maxReplicas))) -}}
{{- $errs = append $errs (printf "autoscaling.ratio.max: %v cannot hold: prefill.autoscaling.minReplicas (%d) over decode.autoscaling.maxReplicas (%d) is already above it. Raise autoscaling.ratio.max or decode.autoscaling.maxReplicas, or lower prefill.autoscaling.minReplicas." $ratio.max (int $pa.minReplicas) (int $da.maxReplicas)) -}}
{{- end -}}
{{- if and (not (kindIs "invalid" $ratio.min)) (lt (float64 $pa.maxReplicas) (mulf (float64 $ratio.min) (float64 (max 1 (int $da.minReplicas))))) -}}
{{- $errs = append $errs (printf "autoscaling.ratio.min: %v cannot hold: prefill.autoscaling.maxReplicas (%d) over decode.autoscaling.minReplicas (%d) is already below it. Lower autoscaling.ratio.min or decode.autoscaling.minReplicas, or raise prefill.autoscaling.maxReplicas." $ratio.min (int $pa.maxReplicas) (max 1 (int $da.minReplicas))) -}}
{{- end -}}
{{- end -}}

{{- /* Disaggregation: what vLLM's NIXL KV transfer supports (PP limits are in the schema) */ -}}
{{- if $disagg -}}
{{- $p := $V.prefill -}}
{{- $d := $V.decode -}}
{{- if and (gt (int $p.tensorParallelSize) (int $d.tensorParallelSize)) (not $V.kvTransfer.allowPrefillTpGreaterThanDecode) -}}
{{- $errs = append $errs (printf "prefill.tensorParallelSize: %d is greater than decode.tensorParallelSize (%d); NIXL cannot split a prefill TP group across fewer decode ranks. Lower it, or set kvTransfer.allowPrefillTpGreaterThanDecode: true if your vLLM supports it." (int $p.tensorParallelSize) (int $d.tensorParallelSize)) -}}
{{- end -}}
{{- /* NIXL side-channel ports: push uses the one base port per engine, pull base + replica rank x TP x PP */ -}}
{{- $span := dict -}}
{{- range $role := $roles -}}
{{- $v := index $V $role -}}
{{- $n := 1 -}}
{{- if not (include "ray-llm-disagg.explicitSideChannel" $) -}}
{{- $n = mul (ternary (int $v.autoscaling.maxReplicas) (int $v.replicas) $v.autoscaling.enabled) (mul (int $v.tensorParallelSize) (int $v.pipelineParallelSize)) -}}
{{- end -}}
{{- $_ := set $span $role (list (int $v.sideChannelPort) (add (int $v.sideChannelPort) (max 1 $n))) -}}
{{- end -}}
{{- $pr := $span.prefill -}}
{{- $dr := $span.decode -}}
{{- if and (lt (index $pr 0) (index $dr 1)) (lt (index $dr 0) (index $pr 1)) -}}
{{- $errs = append $errs (printf "decode.sideChannelPort: NIXL side-channel ports %d-%d (decode) overlap %d-%d (prefill); with %s each role needs its own range (pull: base + replica rank x TP x PP)." (index $dr 0) (sub (index $dr 1) 1) (index $pr 0) (sub (index $pr 1) 1) $V.kvTransfer.connector) -}}
{{- end -}}
{{- end -}}

{{- /* Serve's proxy must not time requests out before the app's first-token deadline */ -}}
{{- with (default dict $V.serve.httpOptions).request_timeout_s -}}
{{- if lt (float64 .) (float64 $V.timeouts.firstTokenS) -}}
{{- $errs = append $errs (printf "serve.httpOptions.request_timeout_s: %v s is shorter than timeouts.firstTokenS (%v s): Serve would time out requests the app still waits for. Raise it, or lower timeouts.firstTokenS." . $V.timeouts.firstTokenS) -}}
{{- end -}}
{{- end -}}

{{- /* frontend.maxReplicasPerNode: the Ray pods that can take a frontend replica must hold frontend.replicas,
or Serve leaves the rest pending and the app never becomes RUNNING (null derives a value that fits). */ -}}
{{- $fe := $V.frontend -}}
{{- if and (not $fe.directStreaming) (not (kindIs "invalid" $fe.maxReplicasPerNode)) -}}
{{- $holders := include "ray-llm-disagg.frontendHolders" . | fromJson -}}
{{- if gt (int $fe.replicas) (mul (int $fe.maxReplicasPerNode) (int $holders.n)) -}}
{{- $errs = append $errs (printf "frontend.maxReplicasPerNode: %d frontend replicas at most %d per Ray pod need %d pods that can take one, but this release has at most %d (%s). Lower frontend.replicas, raise frontend.maxReplicasPerNode (null: 1 where it fits, else no limit), or set frontend.numCpus: 0 so the head can take one." (int $fe.replicas) (int $fe.maxReplicasPerNode) (int (ceil (divf (float64 $fe.replicas) (float64 $fe.maxReplicasPerNode)))) (int $holders.n) $holders.why) -}}
{{- end -}}
{{- end -}}

{{- /* Admission control must fit under what Serve lets reach a frontend replica (AppConfig._check_admission_fits_frontend,
defaults as in AppConfig.admission_limits): beyond frontend.maxOngoingRequests Serve queues without bound. */ -}}
{{- $maxOngoing := int $V.frontend.maxOngoingRequests -}}
{{- $adm := default dict $V.admission -}}
{{- $ovf := ternary (int $V.overflow.maxInFlight) 0 (and $V.overflow.enabled true) -}}
{{- $room := sub $maxOngoing $ovf -}}
{{- $inFlight := max 1 (div $room 2) -}}
{{- if not (kindIs "invalid" $adm.maxInFlight) -}}{{- $inFlight = int $adm.maxInFlight -}}
{{- else if not (kindIs "invalid" $adm.maxQueued) -}}{{- $inFlight = max 1 (sub $room (int $adm.maxQueued)) -}}{{- end -}}
{{- $queued := max 0 (sub $room $inFlight) -}}
{{- if not (kindIs "invalid" $adm.maxQueued) -}}{{- $queued = int $adm.maxQueued -}}{{- end -}}
{{- $wanted := add $inFlight $queued $ovf -}}
{{- if gt $wanted $maxOngoing -}}
{{- $parts := list (printf "admission.maxInFlight (%d%s)" $inFlight (ternary ", derived" "" (kindIs "invalid" $adm.maxInFlight))) (printf "admission.maxQueued (%d%s)" $queued (ternary ", derived" "" (kindIs "invalid" $adm.maxQueued))) -}}
{{- if $ovf -}}{{- $parts = append $parts (printf "overflow.maxInFlight (%d, overflow.enabled)" $ovf) -}}{{- end -}}
{{- $errs = append $errs (printf "admission: %s = %d exceeds frontend.maxOngoingRequests (%d): Serve would queue the rest without bound before admission control sees it. Raise frontend.maxOngoingRequests, or lower them." (join " + " $parts) $wanted $maxOngoing) -}}
{{- end -}}

{{- /* NewClusterWithIncrementalUpgrade: what KubeRay checks when it reconciles (so it fails here, at install) */ -}}
{{- if eq $V.upgradeStrategy.type "NewClusterWithIncrementalUpgrade" -}}
{{- $o := $V.upgradeStrategy.clusterUpgradeOptions -}}
{{- if not (include "ray-llm-disagg.autoscaling" .) -}}
{{- $errs = append $errs (printf "upgradeStrategy.type: NewClusterWithIncrementalUpgrade needs the Ray autoscaler (KubeRay refuses the RayService without it): set autoscaling.enabled on %s, or use NewCluster." (ternary "prefill or decode" "decode" $disagg)) -}}
{{- end -}}
{{- if and (not (kindIs "invalid" $o.maxSurgePercent)) (not (kindIs "invalid" $o.stepSizePercent)) (gt (int $o.stepSizePercent) (int $o.maxSurgePercent)) -}}
{{- $errs = append $errs (printf "upgradeStrategy.clusterUpgradeOptions.stepSizePercent (%d) is above maxSurgePercent (%d): KubeRay moves at most as much traffic per step as the new cluster gained capacity." (int $o.stepSizePercent) (int $o.maxSurgePercent)) -}}
{{- end -}}
{{- end -}}

{{- /* The app's API keys: one source */ -}}
{{- if and $apiKeys (index (default dict $V.auth) "apiKeysFile") -}}
{{- $errs = append $errs "auth.apiKeysFile: set together with auth.apiKeySecret, which already sets the app's keys file; use one of them." -}}
{{- end -}}

{{- /* Ingress: derived annotations the user's must not contradict */ -}}
{{- if $V.ingress.enabled -}}
{{- $errs = concat $errs (include "ray-llm-disagg.ingressAnnotationErrors" . | fromJsonArray) -}}
{{- end -}}

{{- if $errs -}}
{{- fail (printf "\n\nray-llm-disagg: invalid values:\n  - %s\n" (join "\n  - " $errs)) -}}
{{- end -}}
{{- end -}}
