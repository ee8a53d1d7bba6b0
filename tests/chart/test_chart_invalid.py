"""Bad values make `helm template` (hence `helm install`) fail, naming the offending key and the reason.

Each case: values layered on the chart defaults, the key the message must name (dotted; helm's schema
errors name it as a JSON path, which `key_named` accepts too), a fragment of the reason, and `app`:
whether serve_app's AppConfig must reject the same mistake in the mirrored args (test_chart_rules_agree.py).

Two stages, as in Helm: values.schema.json first (every rule a schema can carry: enums, bounds, names,
and cross-field rules as if/then with their reasons), then the template checks (templates/_validate.tpl:
arithmetic across keys, instance-type tables, the release name). Each stage reports all of its problems at
once. `helm lint --strict` (and `ct lint`) fail on the schema stage; Helm's lint mode turns a template
`fail` into an [INFO] line, so the template stage fails install/upgrade/template only (chart README, "Checks").
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field

import pytest
import yaml

from .conftest import CHART, EXAMPLES, KUBE_VERSION, key_named, render, render_error, tool

P5 = {"node.kubernetes.io/instance-type": "p5.48xlarge"}
P5EN = {"node.kubernetes.io/instance-type": "p5en.48xlarge"}
PUSH = {"kvTransfer": {"connector": "NixlPushConnector"}}
GPU8 = {"tensorParallelSize": 8, "gpusPerHost": 8}
EFA = {"efa": {"enabled": True}}
SCHEMA = "values don't meet the specifications of the schema"
OVERFLOW = {"enabled": True, "baseUrl": "https://api.example.com/v1"}
INCREMENTAL = {"type": "NewClusterWithIncrementalUpgrade"}
INCREMENTAL_OPTIONS = {"stepSizePercent": 10, "intervalSeconds": 30, "gatewayClassName": "istio"}
AUTOSCALED = {"decode": {"autoscaling": {"enabled": True}}}


@dataclass
class Bad:
    id: str
    values: dict
    key: str
    reason: str
    app: bool = False  # AppConfig must reject the mirrored args too
    release: str = "llm"
    extra: list = field(default_factory=list)


def rt(role: str, **kw) -> dict:
    return {role: kw}


INVALID: list[Bad] = [
    # --- vLLM's NIXL KV transfer (schema if/then, app validators) ---
    Bad("decode-pp2-disaggregated", {"decode": {"pipelineParallelSize": 2}},
        "decode.pipelineParallelSize", "no decode-side pipeline parallelism", app=True),
    Bad("decode-pp2-even-with-push", {**PUSH, "decode": {"pipelineParallelSize": 2}},
        "decode.pipelineParallelSize", "no decode-side pipeline parallelism", app=True),
    Bad("prefill-pp2-with-pull-connector", {"prefill": {"pipelineParallelSize": 2}},
        "prefill.pipelineParallelSize", "NixlPushConnector", app=True),
    Bad("prefill-tp-above-decode-tp", {"prefill": {"tensorParallelSize": 8, "gpusPerHost": 8},
                                       "decode": {"tensorParallelSize": 4, "gpusPerHost": 4}},
        "prefill.tensorParallelSize", "allowPrefillTpGreaterThanDecode", app=True),
    Bad("push-same-side-channel-port", {**PUSH, "decode": {"sideChannelPort": 20000}},
        "decode.sideChannelPort", "each role needs its own range"),
    Bad("pull-side-channel-ranges-overlap", {"prefill": {"sideChannelPort": 21990, **GPU8, "replicas": 2},
                                             "decode": {**GPU8}},
        "decode.sideChannelPort", "22000-22007 (decode) overlap 21990-22005 (prefill)"),
    Bad("gpu-fraction-with-tp", {"decode": {"gpuFraction": 0.5, "tensorParallelSize": 2, "gpusPerHost": 2},
                                 "prefill": {"tensorParallelSize": 2, "gpusPerHost": 2}},
        "decode.gpuFraction", "one worker per engine", app=True),
    Bad("gpu-fraction-on-cpu", {"accelerator": "cpu", "decode": {"gpuFraction": 0.5}}, "decode.gpuFraction",
        "with accelerator: cpu leave it at 1", app=True),
    Bad("gpu-fraction-zero", {"decode": {"gpuFraction": 0}}, "decode.gpuFraction", "exclusiveMinimum", app=True),
    Bad("streaming-interval-too-long", {"streaming": {"batchIntervalMs": 5000}}, "streaming.batchIntervalMs", "maximum", app=True),
    Bad("kv-prewarm-not-bool", {"kvTransfer": {"prewarm": "yes"}}, "kvTransfer.prewarm", "want boolean"),
    Bad("libfabric-without-efa", {"kvTransfer": {"backend": "LIBFABRIC"}}, "efa.enabled", "needs efa.enabled"),
    # --- hosts, instance types, EFA per role ---
    Bad("tp-not-multiple-of-gpus-per-host", {"prefill": {"tensorParallelSize": 4, "gpusPerHost": 8},
                                             "decode": {"tensorParallelSize": 4, "gpusPerHost": 4}},
        "prefill.gpusPerHost", "not a multiple of gpusPerHost"),
    Bad("tp-times-pp-not-multiple", {**PUSH, "prefill": {"tensorParallelSize": 2, "pipelineParallelSize": 3, "gpusPerHost": 4},
                                     "decode": {"tensorParallelSize": 2, "gpusPerHost": 2}},
        "prefill.gpusPerHost", "2 x 3 = 6"),
    Bad("more-gpus-per-host-than-instance", {"mode": "aggregated",
                                             "decode": {"tensorParallelSize": 16, "gpusPerHost": 16, "nodeSelector": P5}},
        "decode.gpusPerHost", "p5.48xlarge, with 8 GPUs"),
    Bad("efa-devices-above-p5en", {**EFA, "decode": {**GPU8, "nodeSelector": P5EN, "efaDevicesPerHost": 32}},
        "decode.efaDevicesPerHost", "p5en.48xlarge, with 16 per node"),
    Bad("efa-devices-above-p4de", {**EFA, "prefill": {"nodeSelector": {"node.kubernetes.io/instance-type": "p4de.24xlarge"},
                                                      "efaDevicesPerHost": 32}, "decode": {"efaDevicesPerHost": 1}},
        "prefill.efaDevicesPerHost", "with 4 per node"),
    Bad("efa-karpenter-nodepool-only", {**EFA, "prefill": {"nodeSelector": {"karpenter.sh/nodepool": "prefill"}},
                                        "decode": {"nodeSelector": P5}},
        "prefill.efaDevicesPerHost", "Karpenter NodePool name only"),
    Bad("efa-unknown-instance-type", {**EFA, "prefill": {"nodeSelector": {"node.kubernetes.io/instance-type": "p6e-gb200.36xlarge"}},
                                      "decode": {"efaDevicesPerHost": 4}},
        "prefill.efaDevicesPerHost", "instanceTypes does not list"),
    Bad("efa-affinity-any-type", {**EFA, "decode": {"efaDevicesPerHost": 4}, "prefill": {"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "karpenter.sh/nodepool", "operator": "In", "values": ["prefill"]}]}]}}}}},
        "prefill.efaDevicesPerHost", "do not pin an instance type"),
    Bad("accelerator-type-contradicts-instance", {"decode": {"nodeSelector": P5EN, "acceleratorType": "H100"}},
        "decode.acceleratorType", "p5en.48xlarge (H200 GPUs)"),
    Bad("accelerator-type-mixed-pool", {"prefill": {"acceleratorType": "H100", "affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["p5.48xlarge", "p5en.48xlarge"]}]}]}}}}},
        "prefill.acceleratorType", "mix H100/H200"),
    Bad("hugepages-without-memory-request", {**EFA, "prefill": {"efaDevicesPerHost": 4, "resources": {"requests": None, "limits": None}},
                                             "decode": {"efaDevicesPerHost": 4}},
        "prefill.resources", "hugepages-2Mi"),
    Bad("efa-without-same-zone", {**EFA, "scheduling": {"sameZone": {"enabled": False}},
                                  "prefill": {"nodeSelector": P5, **GPU8}, "decode": {"nodeSelector": P5, **GPU8}},
        "scheduling.sameZone.enabled", "EFA does not cross availability zones"),
    # --- backend / accelerator coherence ---
    Bad("cpu-with-efa", {"accelerator": "cpu", **EFA}, "efa.enabled", "only for GPU workers"),
    Bad("cpu-with-cuda-buffers", {"accelerator": "cpu", "kvTransfer": {"bufferDevice": "cuda"}},
        "kvTransfer.bufferDevice", "need GPU workers", app=True),
    Bad("cpu-with-accelerator-type", {"accelerator": "cpu", "prefill": {"acceleratorType": "H100"}},
        "prefill.acceleratorType", "accelerator: cpu", app=True),
    # --- roles the endpoint needs ---
    Bad("decode-zero-replicas", {"decode": {"replicas": 0}}, "decode.replicas", "nothing to serve"),
    Bad("prefill-zero-replicas", {"prefill": {"replicas": 0}}, "prefill.replicas", "0 replicas would fail them"),
    Bad("prefill-zero-replicas-selective", {"prefill": {"replicas": 0}, "remotePrefillMinTokens": 512},
        "prefill.replicas", "0 replicas would fail them"),
    Bad("autoscaling-min-above-max", {"prefill": {"autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 2}}},
        "prefill.autoscaling.minReplicas", "greater than prefill.autoscaling.maxReplicas", app=True),
    Bad("autoscaling-max-zero", {"decode": {"autoscaling": {"enabled": True, "minReplicas": 0, "maxReplicas": 0}}},
        "decode.autoscaling.maxReplicas", "minimum", app=True),
    # --- engine args and env ---
    Bad("engine-args-reserved-tp", {"decode": {"engineArgs": {"tensor_parallel_size": 4}}},
        "decode.engineArgs.tensor_parallel_size", "set tensorParallelSize of the role instead", app=True),
    Bad("engine-args-reserved-kv", {"prefill": {"engineArgs": {"kv_transfer_config": {"kv_connector": "X"}}}},
        "prefill.engineArgs.kv_transfer_config", "set kvTransfer instead", app=True),
    Bad("engine-args-reserved-model", {"prefill": {"engineArgs": {"model": "other"}}},
        "prefill.engineArgs.model", "set model.source instead", app=True),
    Bad("engine-args-data-parallel", {"decode": {"engineArgs": {"data_parallel_size": 2}}},
        "decode.engineArgs.data_parallel_size", "scale with the replicas of the role", app=True),
    Bad("camelcase-engine-arg", {"prefill": {"engineArgs": {"maxModelLen": 8192}}}, "prefill.engineArgs.maxModelLen", "snake_case"),
    Bad("bad-engine-env-name", {"decode": {"engineEnv": {"my-var": "1"}}}, "decode.engineEnv.my-var", "environment variable name"),
    Bad("bad-global-engine-env-name", {"engineEnv": {"1X": "1"}}, "engineEnv.1X", "environment variable name"),
    Bad("engine-env-not-string", {"decode": {"engineEnv": {"VLLM_X": 1}}}, "decode.engineEnv.VLLM_X", "want string", app=True),
    Bad("bad-efa-env-name", {"efa": {"env": {"FI PROVIDER": "efa"}}}, "efa.env.FI PROVIDER", "environment variable name"),
    Bad("extra-env-owned-by-kuberay", {"extraEnv": [{"name": "RAY_enable_autoscaler_v2", "value": "1"}]},
        "extraEnv.0.name", "neither KubeRay nor the chart owns"),
    Bad("extra-env-hf-token-inline", {"decode": {"extraEnv": [{"name": "HF_TOKEN", "value": "hf_secret"}]}},
        "decode.extraEnv.0.name", "model.hfTokenSecret"),
    Bad("extra-env-overrides-nixl-host", {"prefill": {"extraEnv": [{"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "value": "0.0.0.0"}]}},
        "prefill.extraEnv[0]", "set by the chart on prefill pods"),
    Bad("extra-env-overrides-efa-env", {**EFA, "prefill": {"nodeSelector": P5, **GPU8}, "decode": {"nodeSelector": P5, **GPU8},
                                        "extraEnv": [{"name": "FI_PROVIDER", "value": "tcp"}]},
        "extraEnv[0]", "efa.env"),
    # --- Ray start params, Ray node labels ---
    Bad("ray-start-params-labels", {"prefill": {"rayStartParams": {"labels": "a=b"}}},
        "prefill.rayStartParams.labels", "rejects rayStartParams labels"),
    Bad("ray-labels-override-role", {"decode": {"rayLabels": {"ray-llm-disagg.io/role": "prefill"}}},
        "decode.rayLabels", "set by the chart"),
    Bad("ray-labels-custom-role-key", {"placement": {"roleLabelKey": "example.com/role"},
                                       "decode": {"rayLabels": {"example.com/role": "x"}}},
        "decode.rayLabels.example.com/role", "set by the chart"),
    Bad("bad-ray-label-key", {"prefill": {"rayLabels": {"bad key": "x"}}}, "prefill.rayLabels.bad key", "label key"),
    Bad("bad-ray-label-value", {"prefill": {"rayLabels": {"pool": "p5 large"}}}, "prefill.rayLabels.pool", "label value"),
    Bad("ray-label-vs-pod-label", {"decode": {"rayLabels": {"team": "a"}, "podLabels": {"team": "b"}}},
        "decode.podLabels.team", "would win"),
    Bad("head-num-cpus", {"head": {"rayStartParams": {"num-cpus": "4"}}}, "head.rayStartParams.num-cpus", "set by the chart"),
    Bad("head-dashboard-host", {"head": {"rayStartParams": {"dashboard-host": "127.0.0.1"}}},
        "head.rayStartParams.dashboard-host", "set by the chart"),
    Bad("redis-username-param", {"head": {"rayStartParams": {"redis-username": "u"}}},
        "head.rayStartParams.redis-username", "gcsFaultTolerance"),
    Bad("ray-start-param-not-string", {"decode": {"rayStartParams": {"num-cpus": 8}}}, "decode.rayStartParams.num-cpus", "want string"),
    # --- labels (commonLabels over global over the chart's, selector labels protected) ---
    Bad("common-label-instance", {"commonLabels": {"app.kubernetes.io/instance": "other"}},
        "commonLabels.app.kubernetes.io/instance", "selector label"),
    Bad("common-label-role-key", {"commonLabels": {"ray-llm-disagg.io/role": "x"}},
        "commonLabels.ray-llm-disagg.io/role", "role label"),
    Bad("common-label-custom-role-key", {"placement": {"roleLabelKey": "example.com/role"}, "commonLabels": {"example.com/role": "x"}},
        "commonLabels.example.com/role", "role label"),
    Bad("global-label-managed-by", {"global": {"commonLabels": {"app.kubernetes.io/managed-by": "argo"}}},
        "global.commonLabels.app.kubernetes.io/managed-by", "ownership checks of Helm"),
    Bad("pod-label-component", {"decode": {"podLabels": {"app.kubernetes.io/component": "gpu"}}},
        "decode.podLabels.app.kubernetes.io/component", "selector label"),
    Bad("common-label-value-too-long", {"commonLabels": {"cost-center": "x" * 64}}, "commonLabels.cost-center", "label value"),
    Bad("common-label-value-space", {"commonLabels": {"team": "ml platform"}}, "commonLabels.team", "label value"),
    Bad("common-label-key-bad", {"commonLabels": {"team/": "ml"}}, "commonLabels.team/", "label key"),
    # --- ports: Ray's own, the worker range, each other ---
    Bad("serve-port-gcs", {"serve": {"port": 6379}}, "serve.port", "collides with a port Ray uses"),
    Bad("serve-port-dashboard", {"serve": {"port": 8265}}, "serve.port", "collides with a port Ray uses"),
    Bad("serve-port-metrics", {"serve": {"port": 8080}}, "serve.port", "collides with a port Ray uses"),
    Bad("serve-port-worker-range", {"serve": {"port": 15000}}, "serve.port", "collides with a port Ray uses"),
    Bad("serve-port-privileged", {"serve": {"port": 80}}, "serve.port", "collides with a port Ray uses"),
    Bad("serve-port-custom-metrics", {"head": {"rayStartParams": {"metrics-export-port": "9000"}}, "serve": {"port": 9000}},
        "serve.port", "Ray's metrics port on the head pods"),
    Bad("side-channel-in-custom-worker-range", {"prefill": {"rayStartParams": {"min-worker-port": "20000",
                                                                                      "max-worker-port": "29999"}}},
        "prefill.sideChannelPort", "inside Ray's worker port range 20000-29999"),
    Bad("side-channel-port-worker-range", {"decode": {"sideChannelPort": 12000}}, "decode.sideChannelPort",
        "collides with a port Ray uses"),
    Bad("side-channel-port-privileged", {"decode": {"sideChannelPort": 80}}, "decode.sideChannelPort", "collides with a port Ray uses"),
    Bad("side-channel-equals-serve", {**PUSH, "serve": {"port": 20000}}, "prefill.sideChannelPort", "is serve.port"),
    Bad("http-options-port", {"serve": {"httpOptions": {"port": 9000}}}, "serve.httpOptions.port", "set serve.port instead"),
    Bad("http-options-host", {"serve": {"httpOptions": {"host": "127.0.0.1"}}}, "serve.httpOptions.host", "set by the chart"),
    # --- timeouts and KubeRay annotations ---
    Bad("timeout-zero", {"timeouts": {"firstTokenS": 0}}, "timeouts.firstTokenS", "exclusiveMinimum", app=True),
    Bad("initializing-timeout-words", {"initializingTimeout": "two hours"}, "initializingTimeout", "positive Go duration"),
    Bad("initializing-timeout-zero", {"initializingTimeout": "0s"}, "initializingTimeout", "positive Go duration"),
    Bad("alb-first-token-above-max-idle", {"ingress": {"enabled": True}, "timeouts": {"firstTokenS": 3999}},
        "timeouts.firstTokenS", "ALB idle timeout is at most 4000 s"),
    Bad("annotation-ft-enabled", {"annotations": {"ray.io/ft-enabled": "true"}}, "annotations.ray.io/ft-enabled", "gcsFaultTolerance"),
    Bad("annotation-initializing-timeout", {"annotations": {"ray.io/initializing-timeout": "1h"}},
        "annotations.ray.io/initializing-timeout", "initializingTimeout"),
    Bad("deletion-delay-negative", {"rayClusterDeletionDelaySeconds": -1}, "rayClusterDeletionDelaySeconds", "minimum"),
    # --- ingress derived from TLS and timeouts ---
    Bad("alb-listeners-without-https", {"ingress": {"enabled": True, "host": "llm.example.com",
                                                    "tls": [{"hosts": ["llm.example.com"]}],
                                                    "annotations": {"alb.ingress.kubernetes.io/listen-ports": '[{"HTTP": 80}]'}}},
        "ingress.annotations.alb.ingress.kubernetes.io/listen-ports", "no HTTPS listener"),
    Bad("alb-idle-timeout-too-short", {"ingress": {"enabled": True, "annotations": {
        "alb.ingress.kubernetes.io/load-balancer-attributes": "idle_timeout.timeout_seconds=60"}}},
        "ingress.annotations.alb.ingress.kubernetes.io/load-balancer-attributes", "shorter than the app's first-token deadline"),
    Bad("alb-scheme-twice", {"ingress": {"enabled": True, "annotations": {"alb.ingress.kubernetes.io/scheme": "internet-facing"}}},
        "ingress.annotations.alb.ingress.kubernetes.io/scheme", "ingress.alb.scheme"),
    Bad("alb-ssl-redirect-without-tls", {"ingress": {"enabled": True, "annotations": {"alb.ingress.kubernetes.io/ssl-redirect": "443"}}},
        "ingress.annotations.alb.ingress.kubernetes.io/ssl-redirect", "ingress.tls is empty"),
    Bad("nginx-read-timeout-too-short", {"ingress": {"enabled": True, "className": "nginx", "annotations": {
        "nginx.ingress.kubernetes.io/proxy-read-timeout": "60"}}},
        "ingress.annotations.nginx.ingress.kubernetes.io/proxy-read-timeout", "shorter than the app's first-token deadline"),
    Bad("nginx-buffering-on", {"ingress": {"enabled": True, "className": "nginx", "annotations": {
        "nginx.ingress.kubernetes.io/proxy-buffering": "on"}}},
        "ingress.annotations.nginx.ingress.kubernetes.io/proxy-buffering", "streamed tokens"),
    Bad("ingress-path-relative", {"ingress": {"enabled": True, "paths": [{"path": "v1"}]}}, "ingress.paths.0.path", "starts with /"),
    Bad("ingress-path-type-unknown", {"ingress": {"enabled": True, "paths": [{"path": "/v1", "pathType": "Regex"}]}},
        "ingress.paths.0.pathType", "Prefix"),
    Bad("ingress-path-renamed", {"ingress": {"enabled": True, "path": "/v1"}}, "ingress.path", "additional properties"),
    # --- Serve's system endpoints (/-/routes lists every app to anyone) stay off the Ingress unless asked ---
    Bad("ingress-root-prefix-exposes-system-paths", {"ingress": {"enabled": True, "paths": [{"path": "/"}]}},
        "ingress.paths.0.path", "as a prefix it routes the system endpoints of Serve under /-/"),
    Bad("ingress-dash-prefix-exposes-system-paths", {"ingress": {"enabled": True, "paths": [
        {"path": "/v1"}, {"path": "/-", "pathType": "ImplementationSpecific"}]}},
        "ingress.paths.1.path", "set ingress.exposeSystemPaths"),
    Bad("ingress-exact-routes-endpoint", {"ingress": {"enabled": True, "paths": [{"path": "/-/routes", "pathType": "Exact"}]}},
        "ingress.paths.0.path", "routes the system endpoints of Serve under /-/"),
    Bad("ingress-root-prefix-with-route-prefix", {"serve": {"routePrefix": "/llm"},
                                                  "ingress": {"enabled": True, "paths": [{"path": "/"}]}},
        "ingress.paths.0.path", "/-/routes lists every app"),
    Bad("ingress-host-uppercase", {"ingress": {"enabled": True, "host": "LLM.example.com"}}, "ingress.host", "DNS name"),
    Bad("alb-certificate-not-arn", {"ingress": {"enabled": True, "alb": {"certificateArn": "my-cert"}}},
        "ingress.alb.certificateArn", "ACM certificate ARN"),
    Bad("ingress-path-not-served", {"ingress": {"enabled": True, "paths": [{"path": "/llm"}]}}, "ingress.paths[0].path", "would 404"),
    Bad("ingress-second-path-not-served", {"serve": {"routePrefix": "/llm"}, "ingress": {"enabled": True, "paths": [
        {"path": "/llm/v1"}, {"path": "/health", "pathType": "Exact"}]}}, "ingress.paths[1].path", "would 404"),
    Bad("ingress-exact-api-root-not-served", {"ingress": {"enabled": True, "paths": [{"path": "/v1/", "pathType": "Exact"}]}},
        "ingress.paths[0].path", "would 404"),
    Bad("ingress-opt-in-still-needs-the-app", {"ingress": {"enabled": True, "exposeSystemPaths": True,
                                                           "paths": [{"path": "/-/routes"}, {"path": "/docs"}]}},
        "ingress.paths[1].path", "would 404"),
    Bad("ingress-tls-misses-host", {"ingress": {"enabled": True, "host": "llm.example.com",
                                                "tls": [{"hosts": ["chat.example.com"]}]}},
        "ingress.tls", "no entry covers ingress.host llm.example.com"),
    Bad("nginx-tls-without-secret", {"ingress": {"enabled": True, "className": "nginx", "host": "llm.example.com",
                                                 "tls": [{"hosts": ["llm.example.com"]}]}},
        "ingress.tls[0].secretName", "default certificate"),
    Bad("ingress-class-annotation", {"ingress": {"enabled": True, "annotations": {"kubernetes.io/ingress.class": "nginx"}}},
        "ingress.annotations.kubernetes.io/ingress.class", "set ingress.className"),
    Bad("serve-request-timeout-below-first-token", {"serve": {"httpOptions": {"request_timeout_s": 60}}},
        "serve.httpOptions.request_timeout_s", "shorter than timeouts.firstTokenS"),
    Bad("accelerator-type-lowercase", {"decode": {"acceleratorType": "h100"}}, "decode.acceleratorType", "as Ray spells it"),
    Bad("accelerator-type-unknown", {"prefill": {"acceleratorType": "H1000"}}, "prefill.acceleratorType", "Ray refuses others"),
    Bad("instance-table-accelerator-unknown", {"instanceTypes": {"p7.48xlarge": {"gpus": 8, "efa": 32, "acceleratorType": "X9"}}},
        "/instanceTypes/p7.48xlarge/acceleratorType", "as Ray spells it"),
    # --- image tags: strings (YAML would turn 1.10 into 1.1) ---
    Bad("image-tag-number", {"image": {"tag": 1.10}}, "image.tag", "quote it in YAML"),
    Bad("test-image-tag-number", {"tests": {"image": {"tag": 8.1}}}, "tests.image.tag", "quote it in YAML"),
    # --- resources the chart sets ---
    Bad("gpu-in-resources", {"prefill": {"resources": {"limits": {"nvidia.com/gpu": "4"}}}},
        "prefill.resources.limits.nvidia.com/gpu", "gpusPerHost"),
    Bad("efa-in-resources", {"decode": {"resources": {"requests": {"vpc.amazonaws.com/efa": "16"}}}},
        "decode.resources.requests.vpc.amazonaws.com/efa", "efaDevicesPerHost"),
    Bad("num-gpus-param", {"decode": {"rayStartParams": {"num-gpus": "4"}}}, "decode.rayStartParams.num-gpus", "nvidia.com/gpu limit"),
    # --- pod fields: one shape, names the chart owns ---
    Bad("sidecar-named-like-ray", {"decode": {"sidecars": [{"name": "ray-worker", "image": "busybox"}]}},
        "decode.sidecars.0.name", "other than ray-head / ray-worker"),
    Bad("sidecar-without-image", {"head": {"sidecars": [{"name": "log"}]}}, "head.sidecars.0", "image"),
    Bad("init-and-sidecar-same-name", {"prefill": {"initContainers": [{"name": "fetch", "image": "busybox"}],
                                                   "sidecars": [{"name": "fetch", "image": "busybox"}]}},
        "prefill.sidecars[0].name", "unique across init and regular containers"),
    Bad("native-sidecar-on-1.28", {"prefill": {"initContainers": [{"name": "proxy", "image": "envoy", "restartPolicy": "Always"}]}},
        "prefill.initContainers[0].restartPolicy", "needs Kubernetes >= 1.29", extra=["--kube-version", "1.28.5"]),
    Bad("extra-volume-named-dshm", {"decode": {"extraVolumes": [{"name": "dshm", "emptyDir": {}}]}},
        "decode.extraVolumes[0].name", "a volume the chart adds"),
    Bad("extra-mount-on-dev-shm", {"head": {"extraVolumeMounts": [{"name": "x", "mountPath": "/dev/shm"}]}},
        "head.extraVolumeMounts[0].mountPath", "mounted by the chart"),
    Bad("privileged-false-vs-efa-privileged", {**EFA, "efa": {"enabled": True, "privileged": True},
                                              "prefill": {"nodeSelector": P5, **GPU8, "securityContext": {"privileged": False}},
                                              "decode": {"nodeSelector": P5, **GPU8}},
        "prefill.securityContext.privileged", "efa.privileged"),
    Bad("no-escalation-with-privileged", {"efa": {"enabled": True, "privileged": True},
                                          "prefill": {"nodeSelector": P5, **GPU8, "securityContext": {"allowPrivilegeEscalation": False}},
                                          "decode": {"nodeSelector": P5, **GPU8}},
        "prefill.securityContext.allowPrivilegeEscalation", "privileged"),
    Bad("topology-spread-missing-fields", {"decode": {"topologySpreadConstraints": [{"maxSkew": 1}]}},
        "decode.topologySpreadConstraints.0", "topologyKey"),
    Bad("grace-period-negative", {"head": {"terminationGracePeriodSeconds": -1}}, "head.terminationGracePeriodSeconds", "minimum"),
    Bad("pdb-negative", {"decode": {"podDisruptionBudget": {"enabled": True, "maxUnavailable": -1}}},
        "decode.podDisruptionBudget.maxUnavailable", "minimum"),
    Bad("pdb-percentage", {"decode": {"podDisruptionBudget": {"enabled": True, "maxUnavailable": "50%"}}},
        "decode.podDisruptionBudget.maxUnavailable", "want integer"),
    Bad("shm-not-quantity", {"decode": {"shmSizeLimit": "16 GB"}}, "decode.shmSizeLimit", "Kubernetes quantity"),
    Bad("resources-not-quantity", {"decode": {"resources": {"limits": {"memory": "64 GiB"}}}},
        "decode.resources.limits.memory", "Kubernetes quantity"),
    # --- request limits, admission control, failover, overflow (AppConfig's validators, mirrored) ---
    Bad("overflow-enabled-without-base-url", {"overflow": {"enabled": True}},
        "overflow.baseUrl", "required when overflow.enabled is true", app=True),
    Bad("overflow-base-url-not-http", {"overflow": {"baseUrl": "api.example.com/v1"}}, "overflow.baseUrl", "an https URL", app=True),
    Bad("overflow-base-url-cleartext", {"overflow": {"baseUrl": "http://api.example.com/v1"}}, "overflow.baseUrl",
        "the key would travel in clear text", app=True),
    Bad("overflow-key-file-and-env", {"overflow": {**OVERFLOW, "apiKeyFile": "/keys/k", "apiKeyEnv": "OVERFLOW_KEY"}},
        "overflow.apiKeyEnv", "set overflow.apiKeyFile or overflow.apiKeyEnv, not both", app=True),
    Bad("overflow-secret-and-key-file", {"overflow": {"apiKeySecret": {"name": "overflow-key"}, "apiKeyFile": "/keys/k"}},
        "overflow.apiKeyFile", "overflow.apiKeySecret already sets"),
    Bad("overflow-secret-and-key-env", {"overflow": {**OVERFLOW, "apiKeySecret": {"name": "overflow-key"}, "apiKeyEnv": "K"}},
        "overflow.apiKeyEnv", "overflow.apiKeySecret already sets", app=True),
    Bad("overflow-secret-bad-name", {"overflow": {"apiKeySecret": {"name": "Overflow_Key"}}},
        "overflow.apiKeySecret.name", "Kubernetes object name"),
    Bad("overflow-inline-key", {"overflow": {**OVERFLOW, "apiKey": "sk-inline"}}, "overflow.apiKey", "additional properties"),
    Bad("overflow-queue-threshold-negative", {"overflow": {"queueThreshold": -1}}, "overflow.queueThreshold", "minimum", app=True),
    Bad("admission-above-frontend", {"admission": {"maxInFlight": 600, "maxQueued": 500}},
        "admission.maxInFlight", "= 1100 exceeds frontend.maxOngoingRequests (1000)", app=True),
    Bad("admission-in-flight-above-frontend", {"frontend": {"maxOngoingRequests": 100}, "admission": {"maxInFlight": 150}},
        "admission.maxInFlight", "admission.maxQueued (0, derived) = 150 exceeds frontend.maxOngoingRequests (100)", app=True),
    Bad("admission-plus-overflow-above-frontend", {"overflow": OVERFLOW, "admission": {"maxInFlight": 500, "maxQueued": 500}},
        "overflow.maxInFlight", "overflow.maxInFlight (64, overflow.enabled) = 1064 exceeds frontend.maxOngoingRequests", app=True),
    Bad("overflow-in-flight-above-frontend", {"frontend": {"maxOngoingRequests": 50}, "overflow": OVERFLOW},
        "frontend.maxOngoingRequests", "= 65 exceeds frontend.maxOngoingRequests (50)", app=True),
    Bad("admission-queue-negative", {"admission": {"maxQueued": -1}}, "admission.maxQueued", "minimum", app=True),
    Bad("admission-in-flight-zero", {"admission": {"maxInFlight": 0}}, "admission.maxInFlight", "minimum", app=True),
    Bad("admission-wait-zero", {"admission": {"maxQueueWaitS": 0}}, "admission.maxQueueWaitS", "exclusiveMinimum", app=True),
    Bad("limits-body-too-small", {"limits": {"maxBodyBytes": 100}}, "limits.maxBodyBytes", "minimum", app=True),
    Bad("limits-max-tokens-zero", {"limits": {"maxTokens": 0}}, "limits.maxTokens", "minimum", app=True),
    Bad("limits-max-n-string", {"limits": {"maxN": "8"}}, "limits.maxN", "want integer"),
    Bad("failover-prefill-timeout-zero", {"failover": {"prefillTimeoutS": 0}}, "failover.prefillTimeoutS", "exclusiveMinimum", app=True),
    Bad("failover-retry-after-zero", {"failover": {"retryAfterS": 0}}, "failover.retryAfterS", "minimum", app=True),
    Bad("kv-load-failure-policy-enum", {"kvTransfer": {"loadFailurePolicy": "retry"}}, "kvTransfer.loadFailurePolicy",
        "must be one of", app=True),
    Bad("cors-origins-not-a-list", {"auth": {"corsAllowOrigins": "https://chat.example.com"}}, "auth.corsAllowOrigins",
        "want array", app=True),
    Bad("extra-volume-named-overflow-key", {"overflow": {"apiKeySecret": {"name": "ovk"}},
                                            "decode": {"extraVolumes": [{"name": "overflow-key", "emptyDir": {}}]}},
        "decode.extraVolumes[0].name", "a volume the chart adds"),
    Bad("extra-mount-on-overflow-key-dir", {"overflow": {"apiKeySecret": {"name": "ovk"}},
                                            "head": {"extraVolumeMounts": [{"name": "x", "mountPath": "/etc/ray-llm-disagg/overflow-key"}]}},
        "head.extraVolumeMounts[0].mountPath", "mounted by the chart"),
    # --- the app's API keys, Ray auth, GCS fault tolerance ---
    Bad("api-key-secret-bad-name", {"auth": {"apiKeySecret": {"name": "My_Keys"}}}, "auth.apiKeySecret.name", "Kubernetes object name"),
    Bad("api-key-secret-empty-key", {"auth": {"apiKeySecret": {"name": "keys", "key": ""}}}, "auth.apiKeySecret.key", "Secret key"),
    Bad("ray-auth-mode-typo", {"rayAuth": {"mode": "tokens"}}, "rayAuth.mode", "must be one of"),
    Bad("gcs-ft-without-redis", {"gcsFaultTolerance": {"enabled": True}}, "gcsFaultTolerance.redisAddress", "external Redis"),
    Bad("gcs-ft-redis-password-param", {"gcsFaultTolerance": {"enabled": True, "redisAddress": "redis:6379"},
                                        "head": {"rayStartParams": {"redis-password": "x"}}},
        "head.rayStartParams.redis-password", "gcsFaultTolerance.redisPassword"),
    Bad("gcs-ft-fixed-namespace-new-cluster", {"gcsFaultTolerance": {"enabled": True, "redisAddress": "redis:6379",
                                                                     "externalStorageNamespace": "llm"}},
        "gcsFaultTolerance.externalStorageNamespace", "share this GCS state"),
    Bad("gcs-ft-env-redis-address", {"head": {"extraEnv": [{"name": "RAY_REDIS_ADDRESS", "value": "redis:6379"}]}},
        "head.extraEnv.0.name", "gcsFaultTolerance"),
    # --- preflight ---
    Bad("preflight-without-efa", {"tests": {"efaPreflight": {"enabled": True}}}, "efa.enabled", "preflight checks EFA"),
    Bad("preflight-aggregated", {"mode": "aggregated", **EFA, "decode": {"nodeSelector": P5, **GPU8},
                                 "tests": {"efaPreflight": {"enabled": True}}}, "mode", "needs mode: disaggregated"),
    # --- names ---
    Bad("release-name-too-long", {}, "fullnameOverride", "at most 47", release="a-release-name-that-is-far-too-long-for-kuberay"),
    Bad("fullname-not-dns1035", {"fullnameOverride": "1llm"}, "fullnameOverride", "DNS-1035"),
    Bad("fullname-too-long", {"fullnameOverride": "x" * 48}, "fullnameOverride", "at most 47"),
    Bad("name-override-uppercase", {"nameOverride": "LLM"}, "nameOverride", "DNS-1035"),
    Bad("namespace-override-bad", {"namespaceOverride": "Team_A"}, "namespaceOverride", "namespace name"),
    # --- plain schema: enums, types, unknown keys (typos), old names ---
    Bad("schema-mode-enum", {"mode": "split"}, "mode", "must be one of", app=True),
    Bad("schema-connector-enum", {"kvTransfer": {"connector": "P2pNcclConnector"}}, "kvTransfer.connector", "must be one of", app=True),
    Bad("schema-typo-key", {"prefill": {"tensorParallelsize": 2}}, "prefill.tensorParallelsize", "additional properties"),
    Bad("schema-unknown-top-level", {"efaEnabled": True}, "efaEnabled", "additional properties"),
    Bad("renamed-serve-ingress", {"serveIngress": {"replicas": 2}}, "serveIngress", "additional properties"),
    Bad("renamed-efa-devices", {"efa": {"devicesPerHost": 16}}, "efa.devicesPerHost", "additional properties"),
    Bad("renamed-role-env", {"decode": {"env": {"A": "1"}}}, "decode.env", "additional properties"),
    Bad("schema-empty-model-source", {"model": {"source": ""}}, "model.source", "minLength", app=True),
    Bad("schema-tp-zero", {"decode": {"tensorParallelSize": 0}}, "decode.tensorParallelSize", "minimum", app=True),
    Bad("schema-tp-string", {"decode": {"tensorParallelSize": "8"}}, "decode.tensorParallelSize", "want integer"),
    Bad("schema-frontend-replicas-zero", {"frontend": {"replicas": 0}}, "frontend.replicas", "minimum", app=True),
    Bad("schema-remote-prefill-negative", {"remotePrefillMinTokens": -1}, "remotePrefillMinTokens", "minimum", app=True),
    Bad("schema-role-label-key-reserved", {"placement": {"roleLabelKey": "ray.io/role"}}, "placement.roleLabelKey", "the ray.io/ prefix Ray reserves"),
    Bad("schema-efa-devices-zero", {**EFA, "decode": {"efaDevicesPerHost": 0}}, "decode.efaDevicesPerHost", "minimum"),
    Bad("schema-upgrade-strategy", {"upgradeStrategy": {"type": "Recreate"}}, "upgradeStrategy.type", "must be one of"),
    Bad("incremental-without-options", {"upgradeStrategy": {"type": "NewClusterWithIncrementalUpgrade"}, **AUTOSCALED},
        "upgradeStrategy.clusterUpgradeOptions.stepSizePercent", "percent of traffic moved per step"),
    Bad("incremental-without-gateway-class", {"upgradeStrategy": {**INCREMENTAL, "clusterUpgradeOptions": {
            "stepSizePercent": 10, "intervalSeconds": 30}}, **AUTOSCALED},
        "upgradeStrategy.clusterUpgradeOptions.gatewayClassName", "name an installed GatewayClass"),
    Bad("incremental-surge-above-100", {"upgradeStrategy": {**INCREMENTAL, "clusterUpgradeOptions": {
            **INCREMENTAL_OPTIONS, "maxSurgePercent": 150}}, **AUTOSCALED},
        "upgradeStrategy.clusterUpgradeOptions.maxSurgePercent", "maximum"),
    Bad("incremental-interval-zero", {"upgradeStrategy": {**INCREMENTAL, "clusterUpgradeOptions": {
            **INCREMENTAL_OPTIONS, "intervalSeconds": 0}}, **AUTOSCALED},
        "upgradeStrategy.clusterUpgradeOptions.intervalSeconds", "minimum"),
    Bad("incremental-unknown-option", {"upgradeStrategy": {**INCREMENTAL, "clusterUpgradeOptions": {
            **INCREMENTAL_OPTIONS, "maxUnavailable": 1}}, **AUTOSCALED},
        "upgradeStrategy.clusterUpgradeOptions.maxUnavailable", "additional properties"),
    Bad("incremental-step-above-surge", {"upgradeStrategy": {**INCREMENTAL, "clusterUpgradeOptions": {
            **INCREMENTAL_OPTIONS, "maxSurgePercent": 20, "stepSizePercent": 50}}, **AUTOSCALED},
        "upgradeStrategy.clusterUpgradeOptions.stepSizePercent", "is above maxSurgePercent (20)"),
    Bad("incremental-without-autoscaling", {"upgradeStrategy": {**INCREMENTAL, "clusterUpgradeOptions": INCREMENTAL_OPTIONS}},
        "upgradeStrategy.type", "needs the Ray autoscaler"),
    Bad("schema-image-digest", {"image": {"digest": "sha256:abc"}}, "image.digest", "64 lower-case hex"),
    Bad("schema-network-policy-peer", {"networkPolicy": {"serve": {"from": [{"podSelectr": {}}]}}},
        "networkPolicy.serve.from.0.podSelectr", "additional properties"),
    Bad("schema-extra-volume-without-name", {"decode": {"extraVolumes": [{"emptyDir": {}}]}}, "decode.extraVolumes.0", "name"),
    Bad("schema-enabled-not-bool", {"enabled": "yes"}, "enabled", "want boolean"),
    # --- frontend spread (Serve's max_replicas_per_node): the release's Ray pods must hold every replica ---
    Bad("frontend-spread-more-than-pods", {"frontend": {"directStreaming": False, "replicas": 3, "maxReplicasPerNode": 1}},
        "frontend.maxReplicasPerNode",
        "3 frontend replicas at most 1 per Ray pod need 3 pods that can take one, but this release has at most 2 "
        "(prefill 1, decode 1, not the head"),
    Bad("frontend-spread-aggregated-one-pod",
        {"mode": "aggregated", "frontend": {"directStreaming": False, "maxReplicasPerNode": 1}},
        "frontend.maxReplicasPerNode", "but this release has at most 1 (decode 1, not the head"),
    Bad("drain-grace-too-short", {"decode": {"terminationGracePeriodSeconds": 15}}, "decode.terminationGracePeriodSeconds",
        "15 s is too short for drainOnDelete"),
    Bad("schema-drain-not-bool", {"drainOnDelete": {"enabled": "yes"}}, "drainOnDelete.enabled", "want boolean"),
    Bad("schema-frontend-spread-zero", {"frontend": {"maxReplicasPerNode": 0}}, "frontend.maxReplicasPerNode",
        "minimum", app=True),
]


@pytest.mark.parametrize("case", INVALID, ids=[c.id for c in INVALID])
def test_invalid_values_fail_naming_the_key(case: Bad):
    stderr = render_error(values=case.values, release=case.release, extra=case.extra)
    assert key_named(stderr, case.key), f"stderr does not name {case.key}:\n{stderr}"
    assert case.reason in stderr, f"stderr does not give the reason ({case.reason!r}):\n{stderr}"


def test_case_ids_are_unique_and_many():
    assert len({c.id for c in INVALID}) == len(INVALID)
    assert len(INVALID) >= 100


def _lint(values: dict, extra: list[str], tmp_path) -> subprocess.CompletedProcess:
    f = tmp_path / "values.yaml"
    f.write_text(yaml.safe_dump(values))
    return subprocess.run([tool("helm"), "lint", "--strict", "--kube-version", KUBE_VERSION, str(CHART), "-f", str(f), *extra],
                          capture_output=True, text=True, timeout=120)


def _has_null(v) -> bool:
    return v is None or (isinstance(v, dict) and any(_has_null(x) for x in v.values()))


# (helm lint does not drop keys set to null in a values file the way install/template do; those cases are skipped)
@pytest.mark.parametrize("case", [c for c in INVALID if c.release == "llm" and not _has_null(c.values)], ids=lambda c: c.id)
def test_helm_lint_fails_on_every_schema_rule(case: Bad, tmp_path):
    """What the schema judges, `helm lint --strict` (and `ct lint`) rejects too; template checks show as [INFO]."""
    stderr = render_error(values=case.values, release=case.release, extra=case.extra)
    proc = _lint(case.values, case.extra, tmp_path)
    out = proc.stdout + proc.stderr
    if SCHEMA in stderr:
        assert proc.returncode != 0, f"helm lint passed a schema violation:\n{out}"
        assert key_named(out, case.key) and case.reason in out, out
    else:
        assert "[INFO]" in out and key_named(out, case.key), f"template check not reported by lint:\n{out}"


def test_every_stage_reports_all_problems_at_once():
    """Several mistakes: one failed install lists them all, each with its key (per stage: schema, then templates)."""
    schema = render_error(values={"decode": {"pipelineParallelSize": 2}, "kvTransfer": {"backend": "LIBFABRIC"},
                                  "serve": {"port": 6379}, "commonLabels": {"team": "ml platform"}})
    for key in ("/decode/pipelineParallelSize", "/efa/enabled", "/serve/port", "/commonLabels/team"):
        assert key in schema, schema
    template = render_error(values={"prefill": {"autoscaling": {"enabled": True, "minReplicas": 3, "maxReplicas": 1},
                                                "tensorParallelSize": 4, "gpusPerHost": 4},
                                    "decode": {"tensorParallelSize": 2, "gpusPerHost": 4}})
    for key in ("prefill.autoscaling.minReplicas", "prefill.tensorParallelSize", "decode.gpusPerHost"):
        assert key in template, template


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_examples_reject_decode_pipeline_parallelism(example):
    """The issue's headline check, on every example: decode PP 2 fails at install."""
    stderr = render_error([example], {"mode": "disaggregated", "decode": {"pipelineParallelSize": 2}})
    assert key_named(stderr, "decode.pipelineParallelSize") and "pipeline parallelism" in stderr


def test_prefill_tp_above_decode_is_allowed_when_asked():
    r = render(values={"kvTransfer": {"allowPrefillTpGreaterThanDecode": True},
                       "prefill": {"tensorParallelSize": 8, "gpusPerHost": 8},
                       "decode": {"tensorParallelSize": 4, "gpusPerHost": 4}})
    assert r.args["kv_transfer"]["allow_prefill_tp_greater_than_decode"] is True


def test_decode_pp_is_fine_in_aggregated_mode():
    r = render(values={"mode": "aggregated", "decode": {"pipelineParallelSize": 2}})
    assert r.args["decode"]["pipeline_parallel_size"] == 2


SEPARATE = {"directStreaming": False}  # the frontend deployment these values size (direct streaming is the default)


@pytest.mark.parametrize("values,per_node", [
    ({"frontend": SEPARATE}, 1),                                                 # derived: prefill + decode pods
    ({"mode": "aggregated", "frontend": SEPARATE}, None),                        # derived: one pod, so no limit
    ({"mode": "aggregated", "frontend": {**SEPARATE, "numCpus": 0}}, 1),         # derived: the head takes one
    ({"mode": "aggregated", "frontend": SEPARATE,
      "decode": {"autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 2}}}, 1),
    ({"frontend": {**SEPARATE, "replicas": 3}}, None),                           # derived: 2 pods for 3, no limit
    ({"frontend": {**SEPARATE, "replicas": 4, "maxReplicasPerNode": 2}}, 2),     # as given, it fits
    ({}, None),                                                                  # the default: no frontend deployment
    ({"frontend": {"maxReplicasPerNode": 1}}, 1),                                # passed on; sizes nothing when direct
], ids=["separate", "aggregated", "head-holds-one", "autoscaled-pods", "more-than-pods", "two-per-pod", "default",
        "direct-ignores-spread"])
def test_frontend_spread_renders_what_the_pods_can_hold(values, per_node):
    frontend = render(values=values).args["frontend"]
    assert frontend.get("max_replicas_per_node") == per_node


def test_zero_replicas_are_fine_when_autoscaling_from_zero():
    r = render(values={"prefill": {"replicas": 0, "autoscaling": {"enabled": True, "minReplicas": 0, "maxReplicas": 2}},
                       "decode": {"replicas": 0, "autoscaling": {"enabled": True, "minReplicas": 0, "maxReplicas": 2}}})
    assert r.groups["prefill"]["minReplicas"] == r.groups["decode"]["minReplicas"] == 0
