"""Render every example and a matrix of overrides; check the objects field by field, validate them
offline against the KubeRay CRD (KUBERAY_VERSION) and Kubernetes schemas (kubeconform -strict), and validate
the serve args with the app's own pydantic models (serve_app.config.AppConfig)."""

from __future__ import annotations

import json

import pytest

from .conftest import CI_VALUES, EXAMPLES, container, env_of, kubeconform, kubeconform_many, render
from .expect import check_all, check_serve_config, hosts, roles_of

P5 = {"node.kubernetes.io/instance-type": "p5.48xlarge"}
GPU8 = {"gpusPerHost": 8}

# id -> values layer on top of the chart defaults. Every case must render and pass every check.
MATRIX: dict[str, dict] = {
    "defaults": {},
    "aggregated": {"mode": "aggregated"},
    "aggregated-decode-tp8-pp2-two-hosts": {
        "mode": "aggregated", "decode": {"tensorParallelSize": 8, "pipelineParallelSize": 2, **GPU8}},
    "push-prefill-tp8-pp2-two-hosts": {
        "kvTransfer": {"connector": "NixlPushConnector"},
        "prefill": {"tensorParallelSize": 8, "pipelineParallelSize": 2, **GPU8},
        "decode": {"tensorParallelSize": 8, **GPU8}},
    "push-prefill-tp2-pp4-on-4gpu-hosts": {
        "kvTransfer": {"connector": "NixlPushConnector"},
        "prefill": {"tensorParallelSize": 2, "pipelineParallelSize": 4, "gpusPerHost": 4},
        "decode": {"tensorParallelSize": 2, "gpusPerHost": 2}},
    "push-custom-ports": {
        "kvTransfer": {"connector": "NixlPushConnector"},
        "prefill": {"sideChannelPort": 31000}, "decode": {"sideChannelPort": 32000}},
    "pull-tp4-on-4gpu-hosts": {
        "prefill": {"tensorParallelSize": 4, "gpusPerHost": 4},
        "decode": {"tensorParallelSize": 4, "gpusPerHost": 4}},
    "decode-tp16-over-two-hosts": {
        "prefill": {"tensorParallelSize": 8, **GPU8}, "decode": {"tensorParallelSize": 16, **GPU8}},
    "allow-prefill-tp-above-decode": {
        "kvTransfer": {"allowPrefillTpGreaterThanDecode": True},
        "prefill": {"tensorParallelSize": 4, "gpusPerHost": 4}, "decode": {"tensorParallelSize": 2, "gpusPerHost": 2}},
    "efa-on-p5": {
        "efa": {"enabled": True},
        "prefill": {"tensorParallelSize": 8, **GPU8, "nodeSelector": P5},
        "decode": {"tensorParallelSize": 8, **GPU8, "nodeSelector": P5}},
    "efa-without-hugepages": {"efa": {"enabled": True, "hugepages2Mi": ""},
                              "prefill": {"efaDevicesPerHost": 4}, "decode": {"efaDevicesPerHost": 4}},
    "efa-privileged-ucx": {"efa": {"enabled": True, "privileged": True}, "kvTransfer": {"backend": "UCX"},
                           "prefill": {"efaDevicesPerHost": 2}, "decode": {"efaDevicesPerHost": 2}},
    "efa-custom-env": {"efa": {"enabled": True, "env": {"FI_EFA_USE_HUGE_PAGE": "0", "NCCL_DEBUG": "INFO"}},
                       "prefill": {"nodeSelector": {"node.kubernetes.io/instance-type": "p5.4xlarge"}},
                       "decode": {"nodeSelector": {"node.kubernetes.io/instance-type": "p5.4xlarge"}}},
    "efa-off-no-ipc-lock": {"ipcLock": False},
    "ipc-lock-forced-without-efa": {"ipcLock": True},
    "efa-on-ipc-lock-off": {"efa": {"enabled": True}, "ipcLock": False,
                            "prefill": {"tensorParallelSize": 8, **GPU8, "nodeSelector": P5},
                            "decode": {"tensorParallelSize": 8, **GPU8, "nodeSelector": P5}},
    "autoscaling-prefill": {"prefill": {"autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 3},
                                        "idleTimeoutSeconds": 300}},
    "autoscaling-both-scale-to-zero": {
        "prefill": {"autoscaling": {"enabled": True, "minReplicas": 0, "maxReplicas": 2, "targetOngoingRequests": 4}},
        "decode": {"autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 8}},
        "autoscaler": {"idleTimeoutSeconds": 120}},
    "aggregated-autoscaling": {"mode": "aggregated", "decode": {"autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 4}}},
    "fixed-replicas": {"prefill": {"replicas": 3}, "decode": {"replicas": 2}},
    "ingress-alb": {"ingress": {"enabled": True, "host": "llm.example.com",
                                "tls": [{"hosts": ["llm.example.com"], "secretName": "llm-tls"}]}},
    "ingress-no-class": {"ingress": {"enabled": True, "className": "", "annotations": None,
                                     "paths": [{"path": "/v1"}]}},
    "cpu": {"accelerator": "cpu", "ipcLock": False},
    "cpu-aggregated": {"mode": "aggregated", "accelerator": "cpu"},
    "hf-token-and-tokenizer": {"model": {"hfTokenSecret": {"name": "hf", "key": "hf_token"},
                                         "tokenizerSource": "s3://bucket/tokenizer"}},
    "s3-model-with-irsa": {"model": {"id": "llama", "source": "s3://models/llama-3-8b"},
                           "serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/r"}}},
    "custom-role-label-key": {"placement": {"roleLabelKey": "example.com/pd-role", "frontendLabel": {"pool": "cpu"},
                                            "pinRoles": False}},
    "no-scheduling-preferences": {"scheduling": {"roleAntiAffinity": {"enabled": False}, "sameZone": {"enabled": False}}},
    "user-affinity-merged": {"prefill": {"affinity": {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-east-1a"]}]}]}},
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 10, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                               "labelSelector": {"matchLabels": {"app": "other"}}}}]}}}},
    "existing-service-account": {"serviceAccount": {"create": False, "name": "llm-sa"}},
    "tests-disabled": {"tests": {"enabled": False}},
    "fullname-override": {"fullnameOverride": "my-llm"},
    "upgrade-incremental": {"upgradeStrategy": {"type": "NewClusterWithIncrementalUpgrade", "clusterUpgradeOptions": {
                                "maxSurgePercent": 50, "stepSizePercent": 25, "intervalSeconds": 30,
                                "gatewayClassName": "istio"}},
                            "decode": {"autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 2}}},
    "upgrade-incremental-default-surge": {"mode": "aggregated", "upgradeStrategy": {
                                              "type": "NewClusterWithIncrementalUpgrade", "clusterUpgradeOptions": {
                                                  "stepSizePercent": 100, "intervalSeconds": 1, "gatewayClassName": "eg"}},
                                          "decode": {"autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 2}}},
    "upgrade-none-timeouts-annotations": {"upgradeStrategy": {"type": "None"}, "rayClusterDeletionDelaySeconds": 30,
                                          "initializingTimeout": "90m", "annotations": {"team": "ml"}},
    "image-digest": {"image": {"digest": "sha256:" + "a" * 64}},
    "image-tag": {"image": {"tag": "dev-123"}},
    "direct-streaming": {"frontend": {"directStreaming": True}},
    "direct-streaming-aggregated": {"mode": "aggregated", "frontend": {"directStreaming": True},
                                    "admission": {"maxInFlight": 8, "maxQueued": 0}},
    "selective-disagg-and-serve-options": {"remotePrefillMinTokens": 256, "frontend": {"replicas": 2, "numCpus": 0.5},
                                           "serve": {"httpOptions": {"request_timeout_s": 600}}},
    "extras": {"extraEnv": [{"name": "RAY_SERVE_LOG_LEVEL", "value": "DEBUG"}],
               "head": {"rayStartParams": {"metrics-export-port": "8080"}, "nodeSelector": {"pool": "cpu"},
                        "extraEnv": [{"name": "HEAD_ONLY", "value": "1"}]},
               "prefill": {"extraEnv": [{"name": "NIXL_LOG_LEVEL", "value": "DEBUG"}],
                           "engineEnv": {"VLLM_LOGGING_LEVEL": "DEBUG"},
                           "engineArgs": {"max_model_len": 4096, "enable_prefix_caching": True},
                           "rayLabels": {"example.com/pool": "p5"},
                           "rayStartParams": {"num-cpus": "16"},
                           "extraVolumes": [{"name": "models", "persistentVolumeClaim": {"claimName": "fsx"}}],
                           "extraVolumeMounts": [{"name": "models", "mountPath": "/models", "readOnly": True}],
                           "podAnnotations": {"a": "b"}, "podLabels": {"team": "ml"}, "priorityClassName": "high"}},
    "accelerator-type": {"prefill": {"acceleratorType": "H100"}, "decode": {"acceleratorType": "H200"}},
    "engine-env-timeouts-metrics": {"engineEnv": {"VLLM_LOGGING_LEVEL": "INFO"}, "engineMetrics": False,
                                    "timeouts": {"firstTokenS": 900, "betweenTokensS": 12.5}},
    "service-nlb": {"service": {"type": "LoadBalancer", "annotations": {"service.beta.kubernetes.io/aws-load-balancer-type": "nlb"}}},
    "capabilities-never": {"capabilitiesCheck": "never"},
    "umbrella-globals": {"global": {"commonLabels": {"ray-llm-disagg.io/umbrella": "u", "team": "global"},
                                    "imagePullSecrets": [{"name": "regcred"}, {"name": "own"}], "otherChartSetting": 1},
                         "commonLabels": {"team": "ml"}, "imagePullSecrets": [{"name": "own"}]},
    "common-labels-and-pull-secrets": {"commonLabels": {"cost-center": "42"}, "imagePullSecrets": [{"name": "ecr"}]},
    # ---- what platform teams override (issue 11): each renders, and right ----
    "label-the-chart-also-sets": {"commonLabels": {"app.kubernetes.io/part-of": "llm-platform", "helm.sh/chart": "pinned"},
                                  "global": {"commonLabels": {"app.kubernetes.io/part-of": "umbrella", "team": "g"}}},
    "pod-labels-over-common-labels": {"commonLabels": {"team": "ml"}, "decode": {"podLabels": {"team": "decode-squad"}}},
    "umbrella-condition-enabled": {"enabled": False},
    "namespace-override": {"namespaceOverride": "inference"},
    "alb-with-tls": {"ingress": {"enabled": True, "host": "llm.example.com",
                                 "tls": [{"hosts": ["llm.example.com"]}],
                                 "alb": {"scheme": "internet-facing",
                                         "certificateArn": "arn:aws:acm:us-east-1:111122223333:certificate/abc"}}},
    "alb-long-first-token-deadline": {"ingress": {"enabled": True}, "timeouts": {"firstTokenS": 1800.5}},
    "alb-user-attributes-kept": {"ingress": {"enabled": True, "annotations": {
        "alb.ingress.kubernetes.io/load-balancer-attributes": "deletion_protection.enabled=true"}}},
    "alb-user-idle-timeout-longer": {"ingress": {"enabled": True, "annotations": {
        "alb.ingress.kubernetes.io/load-balancer-attributes": "idle_timeout.timeout_seconds=900"}}},
    "nginx-ingress": {"ingress": {"enabled": True, "className": "nginx", "host": "llm.internal",
                                  "tls": [{"hosts": ["llm.internal"], "secretName": "llm-tls"}]}},
    "other-ingress-class": {"ingress": {"enabled": True, "className": "traefik", "annotations": {"a": "b"}}},
    "efa-per-role-instance-types": {
        "efa": {"enabled": True},
        "prefill": {**GPU8, "tensorParallelSize": 8, "nodeSelector": P5},
        "decode": {**GPU8, "tensorParallelSize": 8, "nodeSelector": {"node.kubernetes.io/instance-type": "p5en.48xlarge"}}},
    "efa-half-host-pods": {"efa": {"enabled": True},
                           "prefill": {"tensorParallelSize": 4, "gpusPerHost": 4, "nodeSelector": P5},
                           "decode": {"tensorParallelSize": 4, "gpusPerHost": 4, "nodeSelector": P5}},
    "efa-karpenter-nodepool-with-devices": {
        "efa": {"enabled": True},
        "prefill": {**GPU8, "tensorParallelSize": 8, "nodeSelector": {"karpenter.sh/nodepool": "prefill"}, "efaDevicesPerHost": 32,
                    "acceleratorType": "H100"},
        "decode": {**GPU8, "tensorParallelSize": 8, "nodeSelector": {"karpenter.sh/nodepool": "decode"}, "efaDevicesPerHost": 16,
                   "acceleratorType": "H200"}},
    "instance-type-by-node-affinity": {
        "efa": {"enabled": True},
        "prefill": {**GPU8, "tensorParallelSize": 8, "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "node.kubernetes.io/instance-type", "operator": "In",
                                                          "values": ["p5.48xlarge", "p5e.48xlarge"]}]}]}}}},
        "decode": {**GPU8, "tensorParallelSize": 8, "nodeSelector": P5}},
    "derived-accelerator-no-efa": {"prefill": {"nodeSelector": {"node.kubernetes.io/instance-type": "g6e.12xlarge"},
                                               "tensorParallelSize": 4, "gpusPerHost": 4},
                                   "decode": {"nodeSelector": {"node.kubernetes.io/instance-type": "g6e.12xlarge"},
                                              "tensorParallelSize": 4, "gpusPerHost": 4}},
    "pod-fields-everywhere": {
        "envFrom": [{"configMapRef": {"name": "llm-env"}}],
        "extraEnv": [{"name": "RAY_SERVE_LOG_LEVEL", "value": "INFO"}, {"name": "SHARED", "value": "global"}],
        **{g: {"schedulerName": "volcano", "runtimeClassName": "nvidia", "priorityClassName": "llm-critical",
               "terminationGracePeriodSeconds": 120,
               "podSecurityContext": {"fsGroup": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
               "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                   "capabilities": {"drop": ["ALL"], "add": ["SYS_PTRACE"]}},
               "topologySpreadConstraints": [
                   {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway"},
                   {"maxSkew": 2, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule",
                    "labelSelector": {"matchLabels": {"app": "mine"}}}],
               "initContainers": [{"name": "fetch-model", "image": "amazon/aws-cli:2.17.0",
                                   "command": ["aws", "s3", "sync", "s3://models/x", "/models"]}],
               "sidecars": [{"name": "fluent-bit", "image": "fluent/fluent-bit:3.1"}],
               "envFrom": [{"secretRef": {"name": f"{g}-env"}}],
               "extraEnv": [{"name": "SHARED", "value": g}],
               "podAnnotations": {"example.com/owner": "ml"}}
           for g in ("head", "prefill", "decode")}},
    "security-without-ipc-lock": {"ipcLock": False, "decode": {"securityContext": {"runAsNonRoot": True, "runAsUser": 1000}}},
    "efa-privileged-with-user-caps": {"efa": {"enabled": True, "privileged": True},
                                      "prefill": {**GPU8, "tensorParallelSize": 8, "nodeSelector": P5,
                                                  "securityContext": {"capabilities": {"add": ["IPC_LOCK", "SYS_NICE"]}}},
                                      "decode": {**GPU8, "tensorParallelSize": 8, "nodeSelector": P5}},
    "native-sidecar-on-1-29": {"prefill": {"initContainers": [{"name": "proxy", "image": "envoy", "restartPolicy": "Always"}]}},
    "head-priority-and-pdb": {"head": {"priorityClassName": "system-cluster-critical",
                                       "podDisruptionBudget": {"enabled": True, "maxUnavailable": 0}}},
    "pdbs-off": {"prefill": {"podDisruptionBudget": {"enabled": False}}, "decode": {"podDisruptionBudget": {"enabled": False}}},
    "pdb-multi-host-replicas": {"kvTransfer": {"connector": "NixlPushConnector"},
                                "prefill": {**GPU8, "tensorParallelSize": 8, "pipelineParallelSize": 2, "replicas": 3,
                                            "podDisruptionBudget": {"enabled": True, "maxUnavailable": 2}},
                                "decode": {**GPU8, "tensorParallelSize": 8, "replicas": 4}},
    "pdb-autoscaling-floor": {"decode": {"autoscaling": {"enabled": True, "minReplicas": 3, "maxReplicas": 6}}},
    "network-policy-restricted": {"networkPolicy": {
        "serve": {"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateway"}}},
                           {"ipBlock": {"cidr": "10.0.0.0/16"}}]},
        "operator": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kuberay-system"}}},
        "metrics": {"from": []},
        "extraIngress": [{"from": [{"podSelector": {"matchLabels": {"app": "debugger"}}}], "ports": [{"port": 8265}]}]}},
    "network-policy-off": {"networkPolicy": {"enabled": False}},
    "custom-ray-ports": {"head": {"rayStartParams": {"metrics-export-port": "9090", "dashboard-port": "8266"}},
                         "decode": {"rayStartParams": {"metrics-export-port": "9091"}}, "serve": {"port": 8001}},
    "ray-auth-disabled": {"rayAuth": {"mode": "disabled"}},
    "gcs-fault-tolerance": {"gcsFaultTolerance": {"enabled": True, "redisAddress": "redis.example.com:6379",
                                                  "redisPassword": {"secretName": "redis", "key": "pw"}}},
    "gcs-ft-in-place-upgrades-with-namespace": {"upgradeStrategy": {"type": "None"},
                                                "gcsFaultTolerance": {"enabled": True, "redisAddress": "rediss://r:6380",
                                                                      "externalStorageNamespace": "llm-prod"}},
    "api-key-secret": {"auth": {"apiKeySecret": {"name": "llm-api-keys", "key": "keys.txt"}},
                       "tests": {"podAnnotations": {"sidecar.istio.io/inject": "false"},
                                 "resources": {"requests": {"cpu": "50m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}}}},
    "efa-preflight": {"efa": {"enabled": True}, "remotePrefillMinTokens": 1000,
                      "prefill": {**GPU8, "tensorParallelSize": 8, "nodeSelector": P5},
                      "decode": {**GPU8, "tensorParallelSize": 8, "nodeSelector": P5},
                      "auth": {"apiKeySecret": {"name": "keys"}},
                      "tests": {"efaPreflight": {"enabled": True, "canaryRequests": 4}}},
    "extra-objects": {"extraObjects": [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "llm-extra"}, "data": {"release": "{{ .Release.Name }}"}},
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: {{ .Release.Name }}-extra\nstringData:\n  a: b\n"]},
    "scale-to-zero-decode": {"decode": {"replicas": 0, "autoscaling": {"enabled": True, "minReplicas": 0, "maxReplicas": 2}}},
    "aggregated-ignores-prefill-mistakes": {"mode": "aggregated", "prefill": {"replicas": 0, "pipelineParallelSize": 2}},
    "route-prefix-under-ingress-path": {"serve": {"routePrefix": "/llm"},
                                        "ingress": {"enabled": True, "paths": [{"path": "/llm"}], "host": "a.example.com",
                                                    "tls": [{"hosts": ["*.example.com"]}]}},
    "ingress-custom-route-prefix": {"serve": {"routePrefix": "/api/llm/"}, "ingress": {"enabled": True}},
    "ingress-explicit-paths": {"ingress": {"enabled": True, "className": "nginx", "paths": [
        {"path": "/v1/chat/completions", "pathType": "Exact"}, {"path": "/v1/models", "pathType": "ImplementationSpecific"},
        {"path": "/health", "pathType": "Exact"}]}},
    "ingress-system-paths-opted-in": {"ingress": {"enabled": True, "exposeSystemPaths": True, "paths": [{"path": "/"}]}},
    "image-tag-quoted": {"image": {"tag": "1.10"}, "tests": {"image": {"tag": "8.11.1"}}},
    "aggregated-multi-host-efa-same-zone": {"mode": "aggregated", "efa": {"enabled": True},
                                            "decode": {**GPU8, "tensorParallelSize": 8, "pipelineParallelSize": 2,
                                                       "nodeSelector": P5}},
    "serve-request-timeout-above-first-token": {"serve": {"httpOptions": {"request_timeout_s": 600}}, "timeouts": {"firstTokenS": 300}},
    # ---- request limits, admission control, failover, overflow (issue 10) ----
    "overflow-with-key-secret": {"overflow": {"enabled": True, "baseUrl": "https://api.example.com/v1",
                                              "apiKeySecret": {"name": "overflow-api-key", "key": "token"},
                                              "modelMap": {"Qwen/Qwen2.5-7B-Instruct": "qwen2.5-7b-instruct"},
                                              "queueThreshold": 8, "maxInFlight": 32, "onRoleUnavailable": False,
                                              "connectTimeoutS": 2.5},
                                 "auth": {"apiKeySecret": {"name": "llm-api-keys"},
                                          "corsAllowOrigins": ["https://chat.example.com"]}},
    "overflow-key-from-env": {"overflow": {"enabled": True, "baseUrl": "https://fallback.internal:8000/v1",
                                           "apiKeyEnv": "OVERFLOW_API_KEY"},
                              "extraEnv": [{"name": "OVERFLOW_API_KEY",
                                            "valueFrom": {"secretKeyRef": {"name": "fallback", "key": "key"}}}]},
    "overflow-key-secret-while-off": {"overflow": {"apiKeySecret": {"name": "overflow-api-key"}}},
    "limits-admission-failover-changed": {
        "limits": {"maxBodyBytes": 1048576, "maxN": 2, "maxTokens": 4096, "maxMessages": 256, "maxPrompts": 8},
        "admission": {"maxInFlight": 200, "maxQueued": 0, "maxQueueWaitS": 5.5, "retryAfterS": 2},
        "failover": {"retryOtherPrefill": False, "localFallback": False, "routingTimeoutS": 0.5, "prefillTimeoutS": 12,
                     "suspectS": 0, "maxLocalFallbacks": 0, "statusPollS": 1, "retryAfterS": 3},
        "kvTransfer": {"loadFailurePolicy": "fail"},
        "frontend": {"maxOngoingRequests": 300}},
    "admission-exactly-fills-frontend": {"frontend": {"maxOngoingRequests": 200},
                                         "admission": {"maxInFlight": 100, "maxQueued": 50},
                                         "overflow": {"enabled": True, "baseUrl": "https://api.example.com/v1", "maxInFlight": 50}},
    "admission-derived-with-overflow": {"frontend": {"maxOngoingRequests": 65},
                                        "overflow": {"enabled": True, "baseUrl": "https://api.example.com/v1"}},
}


def _id(p) -> str:
    return p.stem


# ------------------------------------------------------------------------------------------------
# Examples
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("example", EXAMPLES, ids=_id)
def test_example_structure(example):
    check_all(render([example]))


@pytest.fixture(scope="module")
def schema_results() -> dict:
    """Every example and matrix render, validated by one kubeconform run."""
    renders = {f"example:{e.stem}": render([e]) for e in EXAMPLES}
    renders.update({f"ci:{c.stem}": render([c]) for c in CI_VALUES})
    renders.update({f"matrix:{c}": render(values=v) for c, v in MATRIX.items()})
    results = kubeconform_many({k: r.stdout for k, r in renders.items()})
    return {k: (renders[k], results[k]) for k in renders}


@pytest.mark.parametrize("example", EXAMPLES, ids=_id)
def test_example_validates_against_kuberay_and_k8s_schemas(example, schema_results):
    _schema_ok(*schema_results[f"example:{example.stem}"])


@pytest.mark.parametrize("ci", CI_VALUES, ids=_id)
def test_ci_values_validate_against_kuberay_and_k8s_schemas(ci, schema_results):
    check_all(render([ci]))
    _schema_ok(*schema_results[f"ci:{ci.stem}"])


def test_every_kind_the_chart_renders_is_validated(schema_results):
    """The matrix covers every kind (hooks included), each against its strict schema."""
    kinds = {res["kind"] for _, results in schema_results.values() for res in results}
    assert kinds >= {"RayService", "ServiceAccount", "Ingress", "NetworkPolicy", "PodDisruptionBudget", "Pod",
                     "ConfigMap", "Role", "RoleBinding", "Secret"}


def test_the_three_examples_exist():
    assert {p.name for p in EXAMPLES} >= {"p5-llama3-70b.yaml", "p5en-deepseek-v3.yaml", "cpu-tiny.yaml"}


def test_p5_llama3_70b_is_the_classic_case():
    r = render([e for e in EXAMPLES if e.name == "p5-llama3-70b.yaml"])
    pre, dec = r.groups["prefill"], r.groups["decode"]
    # prefill TP 8 x PP 2 over two 8-GPU hosts per replica; decode TP 8 on one host
    assert pre["numOfHosts"] == 2 and dec["numOfHosts"] == 1
    for g in (pre, dec):
        res = container(g["template"])["resources"]["limits"]
        assert res["nvidia.com/gpu"] == "8"
        assert res["vpc.amazonaws.com/efa"] == "32"
        assert res["hugepages-2Mi"] == "5120Mi"
        assert g["template"]["spec"]["nodeSelector"]["node.kubernetes.io/instance-type"] == "p5.48xlarge"
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in g["template"]["spec"]["tolerations"]
        assert env_of(container(g["template"]))["FI_PROVIDER"]["value"] == "efa"
    # pools by the labels the simulated cluster (and Karpenter) set
    assert pre["template"]["spec"]["nodeSelector"]["karpenter.sh/nodepool"] == "prefill"
    assert dec["template"]["spec"]["nodeSelector"]["karpenter.sh/nodepool"] == "decode"
    assert r.head["template"]["spec"]["nodeSelector"] == {"karpenter.sh/nodepool": "cpu"}
    args = r.args
    assert args["kv_transfer"] == {"connector": "NixlPushConnector", "backend": "LIBFABRIC", "buffer_device": "cuda",
                                   "allow_prefill_tp_greater_than_decode": False, "prewarm": True, "prewarm_timeout_s": 120,
                                   "tokenize_once": True,
                                   "load_failure_policy": "recompute"}
    assert (args["prefill"]["tensor_parallel_size"], args["prefill"]["pipeline_parallel_size"]) == (8, 2)
    assert (args["decode"]["tensor_parallel_size"], args["decode"]["pipeline_parallel_size"]) == (8, 1)
    # push connector: explicit, distinct side-channel ports per role (Ray 2.58 leaves them unset)
    assert (args["prefill"]["side_channel_port"], args["decode"]["side_channel_port"]) == (20000, 22000)
    assert args["model"]["id"] == "meta-llama/Meta-Llama-3-70B-Instruct"


def test_p5en_deepseek_autoscales_with_pull_connector():
    r = render([e for e in EXAMPLES if e.name == "p5en-deepseek-v3.yaml"])
    assert r.cluster["enableInTreeAutoscaling"] is True
    for role in ("prefill", "decode"):
        g = r.groups[role]
        assert g["numOfHosts"] == 1
        assert g["minReplicas"] < g["maxReplicas"]
        assert container(g["template"])["resources"]["limits"]["vpc.amazonaws.com/efa"] == "16"
        assert r.args[role]["side_channel_port"] == {"prefill": 20000, "decode": 22000}[role], "Ray's bases, passed as they are"
        assert "VLLM_NIXL_SIDE_CHANNEL_PORT" not in env_of(container(g["template"])), "Ray sets it per replica (pull)"
    assert r.args["kv_transfer"]["connector"] == "NixlConnector"
    assert r.args["prefill"]["accelerator_type"] == r.args["decode"]["accelerator_type"] == "H200"


def test_cpu_tiny_has_no_gpus_and_no_efa():
    r = render([e for e in EXAMPLES if e.name == "cpu-tiny.yaml"])
    text = r.stdout
    for needle in ("nvidia.com/gpu", "vpc.amazonaws.com/efa", "hugepages-2Mi", "FI_PROVIDER", "IPC_LOCK"):
        assert needle not in text, needle
    assert r.args["accelerator"] == "cpu"
    assert r.args["kv_transfer"] == {"connector": "NixlConnector", "backend": "UCX", "buffer_device": "cpu",
                                     "allow_prefill_tp_greater_than_decode": False, "prewarm": True, "prewarm_timeout_s": 120,
                                     "tokenize_once": True, "load_failure_policy": "recompute"}
    for g in r.groups.values():
        assert not g["template"]["spec"].get("tolerations")
        limits = container(g["template"])["resources"]["limits"]
        assert set(limits) == {"cpu", "memory"}


# ------------------------------------------------------------------------------------------------
# Matrix
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", list(MATRIX), ids=str)
def test_matrix_structure(case):
    check_all(render(values=MATRIX[case]))


@pytest.mark.parametrize("case", list(MATRIX), ids=str)
def test_matrix_validates_against_kuberay_and_k8s_schemas(case, schema_results):
    _schema_ok(*schema_results[f"matrix:{case}"])


@pytest.mark.parametrize("example", EXAMPLES, ids=_id)
@pytest.mark.parametrize("mode", ["aggregated", "disaggregated"])
def test_examples_in_both_modes_give_valid_app_args(example, mode):
    """Same examples, other mode: the args still satisfy serve_app's AppConfig."""
    cfg = check_serve_config(render([example], {"mode": mode}))
    assert list(cfg.roles()) == (["decode"] if mode == "aggregated" else ["prefill", "decode"])


@pytest.mark.parametrize(
    ("tp", "pp", "gpus", "expected"),
    [(1, 1, 1, 1), (8, 1, 8, 1), (8, 2, 8, 2), (16, 1, 8, 2), (4, 4, 8, 2), (2, 4, 4, 2), (8, 4, 8, 4), (4, 1, 2, 2)],
)
def test_num_of_hosts_is_tp_times_pp_over_gpus_per_host(tp, pp, gpus, expected):
    r = render(values={"mode": "aggregated", "decode": {"tensorParallelSize": tp, "pipelineParallelSize": pp, "gpusPerHost": gpus}})
    assert r.groups["decode"]["numOfHosts"] == expected == hosts(r.values, "decode")
    assert container(r.groups["decode"]["template"])["resources"]["limits"]["nvidia.com/gpu"] == str(gpus)


def test_one_template_renders_both_roles():
    """Give both roles identical values: the groups must then differ only in what names the role."""
    same = {"tensorParallelSize": 8, "gpusPerHost": 8, "nodeSelector": {"pool": "gpu"}, "engineArgs": {"max_model_len": 1024},
            "efaDevicesPerHost": 8, "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                                                   "whenUnsatisfiable": "ScheduleAnyway"}],
            "podDisruptionBudget": {"enabled": True, "maxUnavailable": 1}, "sidecars": [{"name": "log", "image": "busybox"}],
            "resources": {"requests": {"cpu": "4", "memory": "8Gi"}, "limits": {"cpu": "4", "memory": "8Gi"}}}
    r = render(values={"prefill": same, "decode": same, "efa": {"enabled": True}})
    pre = json.dumps(r.groups["prefill"], sort_keys=True)
    dec = json.dumps(r.groups["decode"], sort_keys=True)
    # swap the role names in the decode group: the result must be the prefill group
    dec_as_pre = dec.replace("prefill", "\0").replace("decode", "prefill").replace("\0", "decode")
    assert pre == dec_as_pre, "prefill and decode groups differ beyond their role names"


def test_aggregated_renders_only_decode():
    r = render(values={"mode": "aggregated"})
    assert list(r.groups) == ["decode"]
    assert "prefill" not in r.args and "kv_transfer" not in r.args
    assert roles_of(r.values) == ["decode"]


def test_helm_values_types_are_preserved_in_serve_args():
    """Integers stay integers and floats floats through helm's float64 values (vLLM is strict)."""
    r = render(values={"prefill": {"engineArgs": {"max_model_len": 131072, "gpu_memory_utilization": 0.92,
                                                  "max_num_batched_tokens": 1000000000, "enforce_eager": True,
                                                  "override_generation_config": {"temperature": 0.6}}}})
    ea = r.args["prefill"]["engine_args"]
    assert ea["max_model_len"] == 131072 and isinstance(ea["max_model_len"], int)
    assert ea["max_num_batched_tokens"] == 10**9 and isinstance(ea["max_num_batched_tokens"], int)
    assert ea["gpu_memory_utilization"] == 0.92
    assert ea["enforce_eager"] is True
    assert ea["override_generation_config"] == {"temperature": 0.6}


def test_release_name_feeds_every_name():
    r = render(values={}, release="chat")
    name = "chat-ray-llm-disagg"
    assert r.rayservice["metadata"]["name"] == name
    assert r.one("ServiceAccount")["metadata"]["name"] == name
    r2 = render(values={}, release="ray-llm-disagg-prod")
    assert r2.rayservice["metadata"]["name"] == "ray-llm-disagg-prod"


def _schema_ok(r, results: list[dict]) -> None:
    bad = [res for res in results if res["status"] != "statusValid"]
    assert not bad, "kubeconform: " + json.dumps(bad, indent=1)
    assert sorted(res["kind"] for res in results) == sorted(d["kind"] for d in r.docs), "every object validated, none skipped"
    assert "RayService" in {res["kind"] for res in results}


def test_kubeconform_really_checks_the_kuberay_schema():
    """Guard against a silently permissive validator: an unknown worker-group field must be rejected."""
    import yaml

    r = render(values={})
    docs = [dict(d) for d in r.docs]
    rs = next(d for d in docs if d["kind"] == "RayService")
    rs["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["numHosts"] = 2  # typo of numOfHosts
    proc = kubeconform(yaml.safe_dump_all(docs))
    assert proc.returncode != 0
    assert "numHosts" in proc.stdout
    # and the Kubernetes kinds: a NetworkPolicy rule with a typo, a PDB with both forms
    docs = [dict(d) for d in r.docs if d["kind"] in ("NetworkPolicy", "PodDisruptionBudget")]
    assert {d["kind"] for d in docs} == {"NetworkPolicy", "PodDisruptionBudget"}
    for d in docs:
        if d["kind"] == "NetworkPolicy":
            d["spec"]["ingress"][0]["form"] = d["spec"]["ingress"][0].pop("from")
        else:
            d["spec"]["minAvaliable"] = 1
    proc = kubeconform(yaml.safe_dump_all(docs))
    assert proc.returncode != 0 and "form" in proc.stdout and "minAvaliable" in proc.stdout


def test_global_values_from_an_umbrella_chart():
    """global.commonLabels reach every object and pod under commonLabels; global pull secrets are appended."""
    r = render(values=MATRIX["umbrella-globals"])
    for d in r.docs:
        assert d["metadata"]["labels"]["ray-llm-disagg.io/umbrella"] == "u"
        assert d["metadata"]["labels"]["team"] == "ml", "the chart's own commonLabels win"
    for g in r.groups.values():
        assert g["template"]["metadata"]["labels"]["team"] == "ml"
        assert g["template"]["spec"]["imagePullSecrets"] == [{"name": "own"}, {"name": "regcred"}]


def test_set_flags_work_like_values_files():
    """`--set` gives int64 where values files give float64: the template arithmetic handles both."""
    flags = ["--set", "kvTransfer.connector=NixlPushConnector", "--set", "prefill.tensorParallelSize=8",
             "--set", "prefill.pipelineParallelSize=2", "--set", "prefill.gpusPerHost=8",
             "--set", "decode.tensorParallelSize=8", "--set", "decode.gpusPerHost=8", "--set", "decode.replicas=3",
             "--set", "prefill.engineArgs.max_model_len=4096", "--set", "efa.enabled=true",
             "--set", "prefill.efaDevicesPerHost=16", "--set", "decode.efaDevicesPerHost=16"]
    r = render(values={}, extra=flags)
    assert r.groups["prefill"]["numOfHosts"] == 2
    assert r.groups["decode"]["replicas"] == 3
    assert r.args["prefill"]["engine_args"]["max_model_len"] == 4096
    assert r.args["prefill"]["side_channel_port"] == 20000
    assert container(r.groups["decode"]["template"])["resources"]["limits"]["vpc.amazonaws.com/efa"] == "16"


def _ingress_paths(r) -> list[tuple[str, str]]:
    (ing,) = r.all("Ingress")
    (rule,) = ing["spec"]["rules"]
    return [(p["path"], p["pathType"]) for p in rule["http"]["paths"]]


def test_ingress_routes_only_the_app_by_default():
    """Issue 18: by default the Ingress routes the app's API and readiness and nothing under /-/ (Serve's
    /-/routes lists every app and route prefix to anyone); the ALB still checks /-/healthz on the targets."""
    r = render(values={"ingress": {"enabled": True}})
    assert _ingress_paths(r) == [("/v1", "Prefix"), ("/health", "Exact")]
    (ing,) = r.all("Ingress")
    assert ing["metadata"]["annotations"]["alb.ingress.kubernetes.io/healthcheck-path"] == "/-/healthz"
    for prefix in ("/llm", "/llm/", "/team/llm"):
        r = render(values={"serve": {"routePrefix": prefix}, "ingress": {"enabled": True, "className": "nginx"}})
        base = prefix.rstrip("/")
        assert _ingress_paths(r) == [(f"{base}/v1", "Prefix"), (f"{base}/health", "Exact")]


def test_ingress_routes_the_users_paths():
    """An explicit ingress.paths replaces the default (pathType Prefix unless given): e.g. the whole routePrefix."""
    r = render(values={"serve": {"routePrefix": "/llm"}, "ingress": {"enabled": True, "paths": [{"path": "/llm"}]}})
    assert _ingress_paths(r) == [("/llm", "Prefix")]
    r = render(values={"ingress": {"enabled": True, "paths": [{"path": "/v1/models", "pathType": "Exact"}]}})
    assert _ingress_paths(r) == [("/v1/models", "Exact")]
    r = render(values={"ingress": {"enabled": True, "exposeSystemPaths": True, "paths": [{"path": "/"}]}})
    assert _ingress_paths(r) == [("/", "Prefix")]
    # opted in, a path to Serve's own endpoints is taken as it is (Serve answers it; no 404 check)
    r = render(values={"serve": {"routePrefix": "/llm"}, "ingress": {"enabled": True, "exposeSystemPaths": True, "paths": [
        {"path": "/llm"}, {"path": "/-/healthz", "pathType": "Exact"}]}})
    assert _ingress_paths(r) == [("/llm", "Prefix"), ("/-/healthz", "Exact")]


@pytest.mark.parametrize("path,path_type,reaches", [
    ("/", "Prefix", True), ("/-", "Prefix", True), ("/-/", "ImplementationSpecific", True),
    ("/-/routes", "Exact", True), ("/-/healthz", "Prefix", True),
    ("/", "Exact", False), ("/v1", "Prefix", False), ("/-foo", "Prefix", False), ("/health", "Exact", False)])
def test_the_system_path_check_of_expect(path, path_type, reaches):
    from .expect import reaches_system_paths
    assert reaches_system_paths(path, path_type) is reaches


@pytest.mark.parametrize("values,grace,deadline", [
    ({}, 60, "50"),
    ({"decode": {"terminationGracePeriodSeconds": 300}, "prefill": {"terminationGracePeriodSeconds": None}}, None, None),
])
def test_worker_pods_drain_their_ray_node_before_they_stop(values, grace, deadline):
    """drainOnDelete: each worker pod's preStop drains its Ray node within its grace minus 10 s (serve_app/pod/drain.py);
    the head (GCS, Serve controller) has none. A null grace is Kubernetes' 30 s."""
    r = render(values=values)
    want = {"prefill": (grace or 30, deadline or "20"), "decode": (grace or 300, deadline or "290")}
    for role, (g, dl) in want.items():
        spec = r.groups[role]["template"]["spec"]
        assert spec.get("terminationGracePeriodSeconds", 30) == g
        assert container(r.groups[role]["template"])["lifecycle"] == {
            "preStop": {"exec": {"command": ["python", "-m", "serve_app.pod.drain", "--deadline-s", dl]}}}
    assert "lifecycle" not in container(r.head["template"])


def test_no_drain_hook_when_drain_on_delete_is_off():
    r = render(values={"drainOnDelete": {"enabled": False}, "decode": {"terminationGracePeriodSeconds": 5}})
    assert all("lifecycle" not in container(g["template"]) for g in r.groups.values())
    assert r.groups["decode"]["template"]["spec"]["terminationGracePeriodSeconds"] == 5



def test_the_drain_hook_runs_a_module_the_image_installs():
    """The preStop names `serve_app.pod.drain`: setuptools' package discovery (what `pip install .` in
    images/Dockerfile ships) finds `serve_app.pod`, and the module takes the flag the chart passes."""
    import tomllib
    from pathlib import Path

    from setuptools import find_packages

    import serve_app.pod.drain as drain

    root = Path(__file__).resolve().parents[2]
    find = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert "serve_app.pod" in find_packages(str(root), include=find.get("include", ["*"]), exclude=find.get("exclude", ()))
    assert drain.parser().parse_args(["--deadline-s", "50"]).deadline_s == 50.0
