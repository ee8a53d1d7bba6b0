"""What a render must contain, computed from the effective values: one checker for every
example and matrix case, field by field on the parsed objects.

The expectations are written from the chart's contract (README / values.yaml comments), not by
re-running template logic: e.g. numOfHosts = TP x PP / gpusPerHost, EFA resources iff efa.enabled.
"""

from __future__ import annotations

import functools

import yaml

from serve_app.config import AppConfig

from .conftest import CHART, Rendered, container, env_of, ports_of


@functools.lru_cache(maxsize=1)
def chart_yaml() -> dict:
    return yaml.safe_load((CHART / "Chart.yaml").read_text())


def roles_of(v: dict) -> list[str]:
    return ["decode"] if v["mode"] == "aggregated" else ["prefill", "decode"]


def fullname(r: Rendered) -> str:
    v = r.values
    if v.get("fullnameOverride"):
        return v["fullnameOverride"]
    name = v.get("nameOverride") or "ray-llm-disagg"
    return r.release if name in r.release else f"{r.release}-{name}"


def push(v: dict) -> bool:
    return v["mode"] != "aggregated" and v["kvTransfer"]["connector"] == "NixlPushConnector"


def backend(v: dict) -> str:
    return v["kvTransfer"]["backend"] or ("LIBFABRIC" if v["efa"]["enabled"] else "UCX")


def buffer_device(v: dict) -> str:
    return v["kvTransfer"]["bufferDevice"] or ("cuda" if v["accelerator"] == "gpu" else "cpu")


def hosts(v: dict, role: str) -> int:
    rv = v[role]
    if v["accelerator"] != "gpu":
        return 1
    tp, pp, g = rv["tensorParallelSize"], rv["pipelineParallelSize"], rv["gpusPerHost"]
    assert (tp * pp) % g == 0
    return tp * pp // g


def user_labels(v: dict) -> dict:
    """commonLabels over global.commonLabels (an umbrella chart sets the latter once for all copies)."""
    return {**((v.get("global") or {}).get("commonLabels") or {}), **(v.get("commonLabels") or {})}


def pull_secrets(v: dict) -> list[dict]:
    out, seen = [], set()
    for s in (v.get("imagePullSecrets") or []) + ((v.get("global") or {}).get("imagePullSecrets") or []):
        if s["name"] not in seen:
            seen.add(s["name"])
            out.append(s)
    return out


def check_labels_and_pull_secrets(r: Rendered) -> None:
    want = user_labels(r.values)
    pods = [r.head["template"]] + [g["template"] for g in r.groups.values()]
    pods += [p for p in r.all("Pod")]
    for d in r.docs:
        labels = d["metadata"]["labels"]
        assert labels["app.kubernetes.io/instance"] == r.release
        assert labels.items() >= want.items(), (d["kind"], labels)
    for tpl in pods:
        assert tpl["metadata"]["labels"].items() >= want.items()
        assert (tpl["spec"].get("imagePullSecrets") or []) == pull_secrets(r.values)


def check_all(r: Rendered) -> None:
    check_labels_and_pull_secrets(r)
    check_rayservice(r)
    check_head(r)
    for role in roles_of(r.values):
        check_worker_group(r, role)
    check_serve_config(r)
    check_service_account(r)
    check_ingress(r)
    check_test_hook(r)


# ------------------------------------------------------------------------------------------------

def check_rayservice(r: Rendered) -> None:
    v, rs = r.values, r.rayservice
    assert rs["apiVersion"] == "ray.io/v1"
    assert rs["metadata"]["name"] == fullname(r)
    assert len(rs["metadata"]["name"]) <= 47
    spec = rs["spec"]
    assert spec["upgradeStrategy"] == {"type": v["upgradeStrategy"]["type"]}
    if v.get("rayClusterDeletionDelaySeconds") is None:
        assert "rayClusterDeletionDelaySeconds" not in spec
    else:
        assert spec["rayClusterDeletionDelaySeconds"] == v["rayClusterDeletionDelaySeconds"]
    ann = rs["metadata"].get("annotations") or {}
    if v["initializingTimeout"]:
        assert ann["ray.io/initializing-timeout"] == str(v["initializingTimeout"])
    else:
        assert "ray.io/initializing-timeout" not in ann
    for k, val in (v.get("annotations") or {}).items():
        assert ann[k] == val
    # the serve Service KubeRay manages: only the `serve` port, our type and annotations
    svc = spec["serveService"]
    assert svc["spec"]["ports"] == [{"name": "serve", "port": v["serve"]["port"]}]
    assert svc["spec"]["type"] == v["service"]["type"]
    assert "selector" not in svc["spec"], "KubeRay owns the serve Service selector"
    assert (svc["metadata"].get("annotations") or {}) == (v["service"]["annotations"] or {})
    cluster = spec["rayClusterConfig"]
    assert cluster["rayVersion"] == chart_yaml()["annotations"]["ray-llm-disagg.io/ray-version"]
    autoscaled = any(v[role]["autoscaling"]["enabled"] for role in roles_of(v))
    assert bool(cluster.get("enableInTreeAutoscaling")) == autoscaled
    if autoscaled:
        opts = cluster["autoscalerOptions"]
        assert opts["version"] == v["autoscaler"]["version"]
        assert opts["idleTimeoutSeconds"] == v["autoscaler"]["idleTimeoutSeconds"]
    else:
        assert "autoscalerOptions" not in cluster
    assert [g["groupName"] for g in cluster["workerGroupSpecs"]] == roles_of(v)


def image_of(v: dict) -> str:
    img = v["image"]
    if img["digest"]:
        return f"{img['repository']}@{img['digest']}"
    return f"{img['repository']}:{img['tag'] or chart_yaml()['appVersion']}"


def check_head(r: Rendered) -> None:
    v, head = r.values, r.head
    assert head["rayStartParams"]["num-cpus"] == "0"
    assert head["rayStartParams"]["dashboard-host"] == "0.0.0.0"
    for k, val in v["head"]["rayStartParams"].items():
        if k not in ("num-cpus", "dashboard-host"):
            assert head["rayStartParams"][k] == val
    tpl = head["template"]
    c = container(tpl)
    assert c["image"] == image_of(v)
    ports = ports_of(c)
    assert ports["gcs-server"] == 6379
    assert ports["dashboard"] == 8265
    assert ports["client"] == 10001
    assert ports["serve"] == v["serve"]["port"], "KubeRay finds the serve port by the name `serve`"
    assert c["resources"] == v["head"]["resources"]
    res = c["resources"]
    for section in ("requests", "limits"):
        assert "nvidia.com/gpu" not in (res.get(section) or {}), "the head has no GPUs"
    assert (tpl["spec"].get("nodeSelector") or {}) == v["head"]["nodeSelector"]
    assert (tpl["spec"].get("tolerations") or []) == v["head"]["tolerations"]
    check_shm(tpl, c, v["head"]["shmSizeLimit"])
    check_hf_token(r, c)
    assert tpl["spec"]["serviceAccountName"] == service_account_name(r)


def check_shm(tpl: dict, c: dict, size: str) -> None:
    vols = {vol["name"]: vol for vol in tpl["spec"]["volumes"]}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert "/dev/shm" in mounts
    vol = vols[mounts["/dev/shm"]["name"]]
    assert vol["emptyDir"] == {"medium": "Memory", "sizeLimit": size}


def check_hf_token(r: Rendered, c: dict) -> None:
    secret = r.values["model"]["hfTokenSecret"]
    env = env_of(c)
    if secret["name"]:
        assert env["HF_TOKEN"] == {
            "name": "HF_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": secret["name"], "key": secret["key"]}},
        }, "the HF token is referenced from its Secret, never inlined"
    else:
        assert "HF_TOKEN" not in env


def service_account_name(r: Rendered) -> str:
    sa = r.values["serviceAccount"]
    if sa["create"]:
        return sa["name"] or fullname(r)
    return sa["name"] or "default"


def check_worker_group(r: Rendered, role: str) -> None:
    v, rv = r.values, r.values[role]
    g = r.groups[role]
    gpu = v["accelerator"] == "gpu"
    key = v["placement"]["roleLabelKey"]

    # size
    assert g["numOfHosts"] == hosts(v, role)
    if rv["autoscaling"]["enabled"]:
        a = rv["autoscaling"]
        assert (g["minReplicas"], g["maxReplicas"], g["replicas"]) == (a["minReplicas"], a["maxReplicas"], a["minReplicas"])
        if rv["idleTimeoutSeconds"]:
            assert g["idleTimeoutSeconds"] == rv["idleTimeoutSeconds"]
    else:
        assert g["replicas"] == g["minReplicas"] == g["maxReplicas"] == rv["replicas"]

    # Ray node label naming the role: the group's top-level labels (KubeRay >= 1.5), never rayStartParams
    assert g["labels"][key] == role
    for k, val in rv["rayLabels"].items():
        assert g["labels"][k] == val
    assert "labels" not in g["rayStartParams"]
    assert g["rayStartParams"] == rv["rayStartParams"]

    tpl = g["template"]
    spec = tpl["spec"]
    assert tpl["metadata"]["labels"][key] == role
    assert tpl["metadata"]["labels"]["app.kubernetes.io/instance"] == r.release
    assert (spec.get("nodeSelector") or {}) == rv["nodeSelector"]
    assert (spec.get("tolerations") or []) == rv["tolerations"]
    assert spec["serviceAccountName"] == service_account_name(r)
    c = container(tpl)
    assert c["image"] == image_of(v)

    # resources: user cpu/memory, chart-added GPU / EFA / hugepages (requests == limits)
    res = c["resources"]
    for section in ("requests", "limits"):
        got = res.get(section) or {}
        for k, val in (rv["resources"].get(section) or {}).items():
            assert got[k] == val
        if gpu:
            assert got["nvidia.com/gpu"] == str(rv["gpusPerHost"])
        else:
            assert "nvidia.com/gpu" not in got
        if v["efa"]["enabled"]:
            assert got["vpc.amazonaws.com/efa"] == str(v["efa"]["devicesPerHost"])
            if v["efa"]["hugepages2Mi"]:
                assert got["hugepages-2Mi"] == v["efa"]["hugepages2Mi"]
            else:
                assert "hugepages-2Mi" not in got
        else:
            assert "vpc.amazonaws.com/efa" not in got and "hugepages-2Mi" not in got

    # security: IPC_LOCK as configured; privileged only when asked (and EFA on)
    sc = c.get("securityContext") or {}
    caps = (sc.get("capabilities") or {}).get("add") or []
    assert ("IPC_LOCK" in caps) == bool(v["ipcLock"])
    assert bool(sc.get("privileged")) == bool(v["efa"]["enabled"] and v["efa"]["privileged"])

    check_shm(tpl, c, rv["shmSizeLimit"])

    # environment: NIXL side channel, EFA, HF token
    env = env_of(c)
    if v["mode"] != "aggregated":
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    else:
        assert "VLLM_NIXL_SIDE_CHANNEL_HOST" not in env
    if push(v):
        assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"]["value"] == str(rv["sideChannelPort"])
        assert ports_of(c)["nixl-side"] == rv["sideChannelPort"]
    else:
        assert "VLLM_NIXL_SIDE_CHANNEL_PORT" not in env, "Ray sets the port itself for NixlConnector"
    if v["efa"]["enabled"]:
        assert env["FI_PROVIDER"]["value"] == "efa"
        for k, val in v["efa"]["env"].items():
            assert env[k]["value"] == str(val)
        if "FI_EFA_USE_HUGE_PAGE" not in v["efa"]["env"]:
            assert env["FI_EFA_USE_HUGE_PAGE"]["value"] == ("1" if v["efa"]["hugepages2Mi"] else "0")
    else:
        assert not any(k.startswith("FI_") for k in env)
    for e in rv["extraEnv"] + v["env"]:
        assert env[e["name"]] == e
    check_hf_token(r, c)

    # scheduling: preferred role anti-affinity and same-zone affinity, disaggregated only
    aff = spec.get("affinity") or {}
    anti = (aff.get("podAntiAffinity") or {}).get("preferredDuringSchedulingIgnoredDuringExecution") or []
    zone = (aff.get("podAffinity") or {}).get("preferredDuringSchedulingIgnoredDuringExecution") or []
    other = "decode" if role == "prefill" else "prefill"
    anti_ours = [t for t in anti if t["podAffinityTerm"]["labelSelector"].get("matchLabels", {}).get(key) == other]
    if v["mode"] != "aggregated" and v["scheduling"]["roleAntiAffinity"]["enabled"]:
        assert len(anti_ours) == 1
        term = anti_ours[0]
        assert term["weight"] == v["scheduling"]["roleAntiAffinity"]["weight"]
        assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
        assert term["podAffinityTerm"]["labelSelector"]["matchLabels"]["app.kubernetes.io/instance"] == r.release
    else:
        assert not anti_ours
    zone_ours = [t for t in zone if t["podAffinityTerm"]["topologyKey"] == v["scheduling"]["sameZone"]["topologyKey"]]
    if v["mode"] != "aggregated" and v["scheduling"]["sameZone"]["enabled"]:
        assert len(zone_ours) == 1
        sel = zone_ours[0]["podAffinityTerm"]["labelSelector"]
        assert sel["matchLabels"]["app.kubernetes.io/instance"] == r.release
        assert sel["matchExpressions"] == [{"key": key, "operator": "Exists"}]
    else:
        assert not zone_ours
    # the user's own affinity survives
    user = rv["affinity"] or {}
    if "nodeAffinity" in user:
        assert aff["nodeAffinity"] == user["nodeAffinity"]
    for kind in ("podAffinity", "podAntiAffinity"):
        for t in ((user.get(kind) or {}).get("preferredDuringSchedulingIgnoredDuringExecution") or []):
            assert t in (aff[kind]["preferredDuringSchedulingIgnoredDuringExecution"])


def check_serve_config(r: Rendered) -> AppConfig:
    v = r.values
    sc = r.serve_config
    assert sc["http_options"]["host"] == "0.0.0.0"
    assert sc["http_options"]["port"] == v["serve"]["port"]
    for k, val in v["serve"]["httpOptions"].items():
        assert sc["http_options"][k] == val
    app = r.app
    assert app["import_path"] == v["serve"]["importPath"] == "serve_app.builder:build_app"
    assert app["name"] == v["serve"]["appName"]
    assert app["route_prefix"] == v["serve"]["routePrefix"]
    args = app["args"]

    # the contract: the app's own pydantic models accept the args
    cfg = AppConfig.model_validate(args)

    assert cfg.mode == v["mode"]
    assert cfg.model.id == v["model"]["id"]
    assert cfg.model.source == v["model"]["source"]
    assert cfg.model.tokenizer_source == (v["model"]["tokenizerSource"] or None)
    assert cfg.accelerator == v["accelerator"]
    assert set(cfg.roles()) == set(roles_of(v))
    if v["mode"] == "aggregated":
        assert "prefill" not in args
    for role in roles_of(v):
        rv, spec = v[role], getattr(cfg, role)
        assert spec.tensor_parallel_size == rv["tensorParallelSize"]
        assert spec.pipeline_parallel_size == rv["pipelineParallelSize"]
        assert spec.engine_args == rv["engineArgs"]
        assert spec.engine_env == rv["env"]
        assert spec.accelerator_type == (v["acceleratorType"] or None)
        if rv["autoscaling"]["enabled"]:
            a = rv["autoscaling"]
            assert "replicas" not in args[role]
            assert spec.autoscaling is not None
            assert (spec.autoscaling.min_replicas, spec.autoscaling.max_replicas) == (a["minReplicas"], a["maxReplicas"])
            assert spec.autoscaling.target_ongoing_requests == a["targetOngoingRequests"]
        else:
            assert spec.autoscaling is None
            assert spec.replicas == rv["replicas"]
        assert spec.side_channel_port == (rv["sideChannelPort"] if push(v) else None)
        # one Ray node label per role: the key the app selects is the one the group carries
        assert r.groups[role]["labels"][cfg.placement.role_label_key] == role
    assert cfg.placement.role_label_key == v["placement"]["roleLabelKey"]
    assert cfg.placement.pin_roles == v["placement"]["pinRoles"]
    assert cfg.placement.frontend_label == (v["placement"]["ingressLabel"] or None)
    assert cfg.frontend.replicas == v["serveIngress"]["replicas"]
    assert cfg.frontend.max_ongoing_requests == v["serveIngress"]["maxOngoingRequests"]
    assert cfg.engine_env == v["engineEnv"]
    assert cfg.engine_metrics == v["engineMetrics"]
    assert (cfg.timeouts.first_token_s, cfg.timeouts.between_tokens_s) == (
        v["timeouts"]["firstTokenS"], v["timeouts"]["betweenTokensS"])
    if v["mode"] != "aggregated":
        assert cfg.kv_transfer.connector == v["kvTransfer"]["connector"]
        assert cfg.kv_transfer.backend == backend(v)
        assert cfg.kv_transfer.buffer_device == buffer_device(v)
        assert cfg.kv_transfer.allow_prefill_tp_greater_than_decode == v["kvTransfer"]["allowPrefillTPGreaterThanDecode"]
        assert cfg.remote_prefill_min_tokens == v["remotePrefillMinTokens"]
    return cfg


def check_service_account(r: Rendered) -> None:
    sas = r.all("ServiceAccount")
    if r.values["serviceAccount"]["create"]:
        assert [sa["metadata"]["name"] for sa in sas] == [service_account_name(r)]
        assert (sas[0]["metadata"].get("annotations") or {}) == r.values["serviceAccount"]["annotations"]
    else:
        assert not sas


def check_ingress(r: Rendered) -> None:
    v = r.values["ingress"]
    ings = r.all("Ingress")
    if not v["enabled"]:
        assert not ings
        return
    (ing,) = ings
    assert ing["apiVersion"] == "networking.k8s.io/v1"
    assert ing["spec"].get("ingressClassName") == (v["className"] or None)
    assert (ing["metadata"].get("annotations") or {}) == (v.get("annotations") or {})
    (rule,) = ing["spec"]["rules"]
    assert rule.get("host") == (v["host"] or None)
    (path,) = rule["http"]["paths"]
    assert path["path"] == v["path"] and path["pathType"] == v["pathType"]
    assert path["backend"]["service"] == {"name": f"{fullname(r)}-serve-svc", "port": {"name": "serve"}}
    assert (ing["spec"].get("tls") or []) == v["tls"]


def check_test_hook(r: Rendered) -> None:
    t = r.values["tests"]
    pods = [p for p in r.all("Pod") if (p["metadata"].get("annotations") or {}).get("helm.sh/hook") == "test"]
    if not t["enabled"]:
        assert not pods
        return
    (pod,) = pods
    c = container(pod)
    assert c["image"] == f"{t['image']['repository']}:{t['image']['tag']}"
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["URL"] == f"http://{fullname(r)}-serve-svc.llm.svc:{r.values['serve']['port']}/v1/models"
    assert env["MODEL_ID"] == r.values["model"]["id"]
    assert pod["spec"]["restartPolicy"] == "Never"
    assert (pod["spec"].get("nodeSelector") or {}) == t["nodeSelector"]

