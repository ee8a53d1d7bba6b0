"""What a render must contain, computed from the effective values: one checker for every
example and matrix case, field by field on the parsed objects.

The expectations are written from the chart's contract (README / values.yaml comments), not by
re-running template logic: e.g. numOfHosts = TP x PP / gpusPerHost, EFA resources iff efa.enabled,
EFA devices and accelerator type from the role's instance type unless set.
"""

from __future__ import annotations

import functools
import re

import yaml

from serve_app.config import LIVE_FIELDS, AppConfig, CoupledAutoscalingSpec

from .conftest import CHART, Rendered, container, env_of, ports_of

PROTECTED = ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/component",
             "app.kubernetes.io/managed-by")
INSTANCE_KEYS = ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type")
POD_KEYS = ("nodeSelector", "tolerations", "schedulerName", "runtimeClassName", "priorityClassName")


@functools.lru_cache(maxsize=1)
def chart_yaml() -> dict:
    return yaml.safe_load((CHART / "Chart.yaml").read_text())


def roles_of(v: dict) -> list[str]:
    return ["decode"] if v["mode"] == "aggregated" else ["prefill", "decode"]


def groups_of(v: dict) -> list[str]:
    return ["head", *roles_of(v)]


def fullname(r: Rendered) -> str:
    v = r.values
    if v.get("fullnameOverride"):
        return v["fullnameOverride"]
    name = v.get("nameOverride") or "ray-llm-disagg"
    return r.release if name in r.release else f"{r.release}-{name}"


def chart_name(v: dict) -> str:
    return v.get("nameOverride") or "ray-llm-disagg"


def namespace(v: dict) -> str:
    return v.get("namespaceOverride") or "llm"


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


def instance_types(v: dict, role: str) -> list[str]:
    """Instance types the role's nodeSelector or (every term of) its required node affinity pins."""
    rv = v[role]
    for k in INSTANCE_KEYS:
        if k in (rv.get("nodeSelector") or {}):
            return [rv["nodeSelector"][k]]
    terms = ((((rv.get("affinity") or {}).get("nodeAffinity") or {})
              .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or [])
    found = []
    for t in terms:
        vals = [x for e in t.get("matchExpressions") or [] if e["key"] in INSTANCE_KEYS and e["operator"] == "In"
                for x in e["values"]]
        if not vals:
            return []
        found += vals
    return sorted(set(found))


def known(v: dict, role: str) -> list[dict]:
    types = instance_types(v, role)
    table = v["instanceTypes"]
    return [table[t] for t in types] if types and all(t in table for t in types) else []


def efa_devices(v: dict, role: str) -> int:
    rv = v[role]
    if rv.get("efaDevicesPerHost") is not None:
        return rv["efaDevicesPerHost"]
    k = known(v, role)
    gpus, efa = min(x["gpus"] for x in k), min(x["efa"] for x in k)
    return max(1, efa * rv["gpusPerHost"] // gpus)


def accelerator_type(v: dict, role: str) -> str | None:
    if v[role]["acceleratorType"]:
        return v[role]["acceleratorType"]
    if v["accelerator"] != "gpu":
        return None
    accs = {x.get("acceleratorType") for x in known(v, role)}
    return accs.pop() if len(accs) == 1 else None


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


def selector(r: Rendered) -> dict:
    return {"app.kubernetes.io/name": chart_name(r.values), "app.kubernetes.io/instance": r.release}


def group_selector(r: Rendered, group: str) -> dict:
    s = {**selector(r), "app.kubernetes.io/component": group}
    if group != "head":
        s[r.values["placement"]["roleLabelKey"]] = group
    return s


def group_template(r: Rendered, group: str) -> dict:
    return r.head["template"] if group == "head" else r.groups[group]["template"]


def check_labels_and_pull_secrets(r: Rendered) -> None:
    v = r.values
    want = user_labels(v)
    chart = {"helm.sh/chart": f"ray-llm-disagg-{chart_yaml()['version']}", "app.kubernetes.io/part-of": "ray-llm-disagg",
             "app.kubernetes.io/version": chart_yaml()["appVersion"]}
    for d in r.docs:
        if d["metadata"]["name"] in extra_object_names(r):
            continue  # the user's own objects (extraObjects), rendered as given
        labels = d["metadata"]["labels"]
        assert labels["app.kubernetes.io/instance"] == r.release
        assert labels["app.kubernetes.io/name"] == chart_name(v)
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels.items() >= want.items(), (d["kind"], labels)
        for k, val in chart.items():  # the chart's labels unless the user's win
            assert labels[k] == want.get(k, val), (d["kind"], k)
        assert d["metadata"].get("namespace", namespace(v)) == namespace(v)
    for g in groups_of(v):
        tpl = group_template(r, g)
        labels = tpl["metadata"]["labels"]
        assert labels.items() >= group_selector(r, g).items()
        expected = {**want, **(v[g]["podLabels"] or {})}
        for k, val in expected.items():
            if k not in PROTECTED and k != v["placement"]["roleLabelKey"]:
                assert labels[k] == val, (g, k)
        assert (tpl["spec"].get("imagePullSecrets") or []) == pull_secrets(v)
    for pod in r.all("Pod"):
        assert (pod["spec"].get("imagePullSecrets") or []) == pull_secrets(v)
        assert pod["metadata"]["labels"].items() >= want.items()


def check_all(r: Rendered) -> None:
    check_labels_and_pull_secrets(r)
    check_rayservice(r)
    check_head(r)
    for g in groups_of(r.values):
        check_pod_fields(r, g)
    for role in roles_of(r.values):
        check_worker_group(r, role)
    check_serve_config(r)
    check_service_account(r)
    check_ingress(r)
    check_network_policy(r)
    check_pdbs(r)
    check_test_hook(r)
    check_efa_preflight(r)
    check_extra_objects(r)


# ------------------------------------------------------------------------------------------------

def check_rayservice(r: Rendered) -> None:
    v, rs = r.values, r.rayservice
    assert rs["apiVersion"] == "ray.io/v1"
    assert rs["metadata"]["name"] == fullname(r)
    assert len(rs["metadata"]["name"]) <= 47
    spec = rs["spec"]
    upgrade = v["upgradeStrategy"]
    if upgrade["type"] == "NewClusterWithIncrementalUpgrade":
        options = {k: val for k, val in upgrade["clusterUpgradeOptions"].items() if val is not None}
        assert spec["upgradeStrategy"] == {"type": upgrade["type"], "clusterUpgradeOptions": options}
        assert rs["spec"]["rayClusterConfig"]["enableInTreeAutoscaling"] is True, "KubeRay requires the autoscaler"
    else:  # the options only with the strategy that reads them (KubeRay 1.5/1.6 reject them without the gate)
        assert spec["upgradeStrategy"] == {"type": upgrade["type"]}
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
    # Ray token authentication and GCS fault tolerance (KubeRay options)
    if v["rayAuth"]["mode"] == "token":
        assert cluster["authOptions"] == {"mode": "token"}
    else:
        assert "authOptions" not in cluster
    ft = v["gcsFaultTolerance"]
    if ft["enabled"]:
        opts = cluster["gcsFaultToleranceOptions"]
        assert opts["redisAddress"] == ft["redisAddress"]
        if ft["redisPassword"]["secretName"]:
            assert opts["redisPassword"] == {"valueFrom": {"secretKeyRef": {
                "name": ft["redisPassword"]["secretName"], "key": ft["redisPassword"]["key"]}}}
        else:
            assert "redisPassword" not in opts
        assert opts.get("externalStorageNamespace", "") == ft["externalStorageNamespace"]
    else:
        assert "gcsFaultToleranceOptions" not in cluster


def image_of(v: dict) -> str:
    img = v["image"]
    if img["digest"]:
        return f"{img['repository']}@{img['digest']}"
    return f"{img['repository']}:{img['tag'] or chart_yaml()['appVersion']}"


def ray_ports(v: dict, group: str) -> dict[str, int]:
    p = v[group]["rayStartParams"]
    out = {"metrics": int(p.get("metrics-export-port", 8080))}
    if group == "head":
        out.update({"gcs-server": int(p.get("port", 6379)), "dashboard": int(p.get("dashboard-port", 8265)),
                    "client": int(p.get("ray-client-server-port", 10001)), "serve": v["serve"]["port"]})
    return out


def check_head(r: Rendered) -> None:
    v, head = r.values, r.head
    assert head["rayStartParams"]["num-cpus"] == "0"
    assert head["rayStartParams"]["dashboard-host"] == "0.0.0.0"
    for k, val in v["head"]["rayStartParams"].items():
        assert head["rayStartParams"][k] == val
    assert (head.get("labels") or {}) == v["head"]["rayLabels"]
    tpl = head["template"]
    c = container(tpl)
    assert c["name"] == "ray-head"
    ports = ports_of(c)
    for name, port in ray_ports(v, "head").items():
        assert ports[name] == port, name  # KubeRay finds the serve port by the name `serve`
    assert c["resources"] == v["head"]["resources"]
    # only KubeRay's autoscaler sidecar (in the head) uses the Kubernetes API
    autoscaled = any(v[role]["autoscaling"]["enabled"] for role in roles_of(v))
    assert tpl["spec"]["automountServiceAccountToken"] is autoscaled


def check_pod_fields(r: Rendered, group: str) -> None:
    """The ONE pod shape: every group renders the same keys the same way."""
    v, gv = r.values, r.values[group]
    tpl = group_template(r, group)
    spec = tpl["spec"]
    c = container(tpl)
    assert c["image"] == image_of(v)
    assert c["imagePullPolicy"] == v["image"]["pullPolicy"]
    assert spec["serviceAccountName"] == service_account_name(r)
    for k in POD_KEYS:
        assert spec.get(k) == (gv[k] or None), (group, k)
    assert spec.get("terminationGracePeriodSeconds") == gv["terminationGracePeriodSeconds"]
    assert spec.get("securityContext") == (gv["podSecurityContext"] or None)
    assert (tpl["metadata"].get("annotations") or {}) == gv["podAnnotations"]
    # topology spread: an entry without labelSelector gets the group's pod labels
    got = spec.get("topologySpreadConstraints") or []
    assert len(got) == len(gv["topologySpreadConstraints"])
    for want, have in zip(gv["topologySpreadConstraints"], got):
        assert have == {"labelSelector": {"matchLabels": group_selector(r, group)}, **want}
        if "labelSelector" not in want:  # the filled-in selector matches the group's own pods
            assert tpl["metadata"]["labels"].items() >= have["labelSelector"]["matchLabels"].items()
    # init containers as given; sidecars after the Ray container (KubeRay uses containers[0])
    assert (spec.get("initContainers") or []) == gv["initContainers"]
    assert spec["containers"][0] is c and spec["containers"][1:] == gv["sidecars"]
    assert (c.get("envFrom") or []) == v["envFrom"] + gv["envFrom"]
    # env: extraEnv then the group's, the group's replacing a same-named global entry
    env = env_of(c)  # (fails on duplicate names)
    for e in v["extraEnv"]:
        if e["name"] not in {x["name"] for x in gv["extraEnv"]}:
            assert env[e["name"]] == e
    for e in gv["extraEnv"]:
        assert env[e["name"]] == e
    check_hf_token(r, c)
    # volumes: memory-backed /dev/shm, the API-key Secret, /tmp with a read-only root, then the user's
    vols = {vol["name"]: vol for vol in spec["volumes"]}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert vols[mounts["/dev/shm"]["name"]]["emptyDir"] == {"medium": "Memory", "sizeLimit": gv["shmSizeLimit"]}
    keys = v["auth"]["apiKeySecret"]
    if keys["name"]:
        m = mounts["/etc/ray-llm-disagg/api-keys"]
        assert m["readOnly"] is True
        assert vols[m["name"]]["secret"]["secretName"] == keys["name"]
        assert vols[m["name"]]["secret"]["items"] == [{"key": keys["key"], "path": keys["key"]}]
    else:
        assert "/etc/ray-llm-disagg/api-keys" not in mounts
    ovk = v["overflow"]["apiKeySecret"]
    if ovk["name"]:  # the overflow endpoint's key: its own read-only Secret mount on every Ray pod
        m = mounts["/etc/ray-llm-disagg/overflow-key"]
        assert m["readOnly"] is True and m["name"] == "overflow-key"
        assert vols[m["name"]]["secret"] == {"secretName": ovk["name"], "defaultMode": 0o444,
                                             "items": [{"key": ovk["key"], "path": ovk["key"]}]}
    else:
        assert "/etc/ray-llm-disagg/overflow-key" not in mounts and "overflow-key" not in vols
    if (gv["securityContext"] or {}).get("readOnlyRootFilesystem"):
        assert vols[mounts["/tmp"]["name"]]["emptyDir"] == {}
    for vol in gv["extraVolumes"]:
        assert vols[vol["name"]] == vol
    for m in gv["extraVolumeMounts"]:
        assert mounts[m["mountPath"]] == m
    # container security context: the user's, plus IPC_LOCK / privileged on workers
    sc = dict(c.get("securityContext") or {})
    user = dict(gv["securityContext"] or {})
    if group != "head":
        caps = (sc.pop("capabilities", None) or {})
        ipc_lock = v["efa"]["enabled"] if v["ipcLock"] is None else v["ipcLock"]  # null: with EFA only
        user_adds = ((user.get("capabilities") or {}).get("add") or [])
        assert ("IPC_LOCK" in (caps.get("add") or [])) == (bool(ipc_lock) or "IPC_LOCK" in user_adds)
        user_caps = user.pop("capabilities", None) or {}
        for k, val in user_caps.items():
            if k != "add":
                assert caps[k] == val
        assert set(user_caps.get("add") or []) <= set(caps.get("add") or [])
        privileged = bool(v["efa"]["enabled"] and v["efa"]["privileged"])
        assert bool(sc.pop("privileged", False)) == (privileged or bool(user.pop("privileged", False)))
        user.pop("privileged", None)
    assert sc == user


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
    assert g["labels"] == {**rv["rayLabels"], key: role}
    assert "labels" not in g["rayStartParams"]
    assert g["rayStartParams"] == rv["rayStartParams"]

    tpl = g["template"]
    spec = tpl["spec"]
    assert tpl["metadata"]["labels"][key] == role
    assert spec["automountServiceAccountToken"] is False
    c = container(tpl)
    assert c["name"] == "ray-worker"

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
            assert got["vpc.amazonaws.com/efa"] == str(efa_devices(v, role))
            if v["efa"]["hugepages2Mi"]:
                assert got["hugepages-2Mi"] == v["efa"]["hugepages2Mi"]
            else:
                assert "hugepages-2Mi" not in got
        else:
            assert "vpc.amazonaws.com/efa" not in got and "hugepages-2Mi" not in got

    # environment: NIXL side channel, EFA
    env = env_of(c)
    ports = ports_of(c)
    assert ports["metrics"] == ray_ports(v, role)["metrics"]
    if v["mode"] != "aggregated":
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    else:
        assert "VLLM_NIXL_SIDE_CHANNEL_HOST" not in env
    if push(v):
        assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"]["value"] == str(rv["sideChannelPort"])
        assert ports["nixl-side"] == rv["sideChannelPort"]
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

    # scheduling: role anti-affinity (preferred), same zone (required with EFA, else preferred), disaggregated only
    aff = spec.get("affinity") or {}
    anti = (aff.get("podAntiAffinity") or {}).get("preferredDuringSchedulingIgnoredDuringExecution") or []
    other = "decode" if role == "prefill" else "prefill"
    anti_ours = [t for t in anti if t["podAffinityTerm"]["labelSelector"].get("matchLabels", {}).get(key) == other]
    disagg = v["mode"] != "aggregated"
    if disagg and v["scheduling"]["roleAntiAffinity"]["enabled"]:
        assert len(anti_ours) == 1
        term = anti_ours[0]
        assert term["weight"] == v["scheduling"]["roleAntiAffinity"]["weight"]
        assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
        assert term["podAffinityTerm"]["labelSelector"]["matchLabels"]["app.kubernetes.io/instance"] == r.release
    else:
        assert not anti_ours
    zk = v["scheduling"]["sameZone"]["topologyKey"]
    pa = aff.get("podAffinity") or {}
    required = [t for t in pa.get("requiredDuringSchedulingIgnoredDuringExecution") or [] if t["topologyKey"] == zk]
    preferred = [t["podAffinityTerm"] for t in pa.get("preferredDuringSchedulingIgnoredDuringExecution") or []
                 if t["podAffinityTerm"]["topologyKey"] == zk]
    user_pa = (rv["affinity"] or {}).get("podAffinity") or {}
    required = [t for t in required if t not in (user_pa.get("requiredDuringSchedulingIgnoredDuringExecution") or [])]
    if (disagg or v["efa"]["enabled"]) and v["scheduling"]["sameZone"]["enabled"]:
        ours = required if v["efa"]["enabled"] else preferred
        assert len(ours) == 1, "EFA does not cross zones: same zone is required with EFA, preferred otherwise"
        assert not (preferred if v["efa"]["enabled"] else required)
        sel = ours[0]["labelSelector"]
        assert sel["matchLabels"] == selector(r)
        assert sel["matchExpressions"] == [{"key": key, "operator": "Exists"}]
    else:
        assert not required and not preferred
    # the user's own affinity survives
    user = rv["affinity"] or {}
    if "nodeAffinity" in user:
        assert aff["nodeAffinity"] == user["nodeAffinity"]
    for kind in ("podAffinity", "podAntiAffinity"):
        for t in ((user.get(kind) or {}).get("preferredDuringSchedulingIgnoredDuringExecution") or []):
            assert t in (aff[kind]["preferredDuringSchedulingIgnoredDuringExecution"])


def snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


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
    args = r.args  # `args` with the live fields every deployment carries as user_config

    # the contract: the app's own pydantic models accept the args, and then the deployments' user_config
    static = AppConfig.model_validate(r.raw_args)
    cfg = static.with_live(r.user_config)
    assert AppConfig.model_validate(args) == cfg
    # live values are not args (a change to args restarts every replica, engines included): one user_config,
    # on every deployment the app builds, as the app itself renders it
    assert not set(r.raw_args) & set(LIVE_FIELDS), f"live fields in args: {set(r.raw_args) & set(LIVE_FIELDS)}"
    assert [d["name"] for d in app["deployments"]] == cfg.deployment_names()
    assert set(app["deployments"][0]) == {"name", "user_config"}
    assert set(r.user_config) == set(cfg.live()) and static.with_live(cfg.live()) == cfg

    assert cfg.mode == v["mode"]
    assert cfg.model.id == v["model"]["id"]
    assert cfg.model.source == v["model"]["source"]
    assert cfg.model.tokenizer_source == (v["model"]["tokenizerSource"] or None)
    assert cfg.accelerator == v["accelerator"]
    assert set(cfg.roles()) == set(roles_of(v))
    if v["mode"] == "aggregated":
        assert "prefill" not in args and "kv_transfer" not in args
    for role in roles_of(v):
        rv, spec = v[role], getattr(cfg, role)
        assert spec.tensor_parallel_size == rv["tensorParallelSize"]
        assert spec.pipeline_parallel_size == rv["pipelineParallelSize"]
        assert spec.engine_args == rv["engineArgs"]
        assert spec.engine_env == rv["engineEnv"]
        assert spec.accelerator_type == accelerator_type(v, role), "one accelerator type per role"
        assert spec.replicas == rv["replicas"]
        a = rv["autoscaling"]
        assert spec.autoscaled == a["enabled"]
        assert (spec.autoscaling.min_replicas, spec.autoscaling.max_replicas) == (a["minReplicas"], a["maxReplicas"])
        assert spec.autoscaling.target_ongoing_requests == a["targetOngoingRequests"]
        # the NIXL port base: Ray adds replica offsets for NixlConnector; the fixed engine port for NixlPushConnector
        assert spec.side_channel_port == rv["sideChannelPort"]
        # one Ray node label per role: the key the app selects is the one the group carries
        assert r.groups[role]["labels"][cfg.placement.role_label_key] == role
        # plain mirror: every snake_case key of the role is the camelCase value key, nothing else
        chart_only = {"gpus_per_host", "efa_devices_per_host", "idle_timeout_seconds"}
        assert {snake(k) for k in rv} >= set(args[role]) and not (set(args[role]) & chart_only)
    assert cfg.placement.role_label_key == v["placement"]["roleLabelKey"]
    assert cfg.placement.pin_roles == v["placement"]["pinRoles"]
    assert cfg.placement.frontend_label == (v["placement"]["frontendLabel"] or None)
    assert cfg.frontend.replicas == v["frontend"]["replicas"]
    assert cfg.frontend.num_cpus == v["frontend"]["numCpus"]
    assert cfg.frontend.max_ongoing_requests == v["frontend"]["maxOngoingRequests"]
    assert cfg.engine_env == v["engineEnv"]
    assert cfg.engine_metrics == v["engineMetrics"]
    assert (cfg.timeouts.first_token_s, cfg.timeouts.between_tokens_s) == (
        v["timeouts"]["firstTokenS"], v["timeouts"]["betweenTokensS"])
    if v["mode"] != "aggregated":
        assert cfg.kv_transfer.connector == v["kvTransfer"]["connector"]
        assert cfg.kv_transfer.backend == backend(v)
        assert cfg.kv_transfer.buffer_device == buffer_device(v)
        assert cfg.kv_transfer.allow_prefill_tp_greater_than_decode == v["kvTransfer"]["allowPrefillTpGreaterThanDecode"]
        assert cfg.remote_prefill_min_tokens == v["remotePrefillMinTokens"]
    keys = v["auth"]["apiKeySecret"]
    if keys["name"]:
        assert args["auth"]["api_keys_file"] == f"/etc/ray-llm-disagg/api-keys/{keys['key']}"
    else:
        assert "api_keys_file" not in (args.get("auth") or {})
    assert list(cfg.auth.cors_allow_origins) == v["auth"]["corsAllowOrigins"]
    if v["mode"] != "aggregated":
        assert cfg.kv_transfer.load_failure_policy == v["kvTransfer"]["loadFailurePolicy"]
    # request limits, admission, failover: the values as they are (null: unset, the app's default)
    for block, spec in (("limits", cfg.limits), ("admission", cfg.admission), ("failover", cfg.failover)):
        for key, val in v[block].items():
            assert getattr(spec, snake(key)) == val, f"{block}.{key}"
    # overflow: the values, the key file from overflow.apiKeySecret
    o, ov = cfg.overflow, v["overflow"]
    assert (o.enabled, o.base_url, o.model_map, o.max_in_flight, o.queue_threshold) == (
        ov["enabled"], ov["baseUrl"] or None, ov["modelMap"], ov["maxInFlight"], ov["queueThreshold"])
    assert (o.on_saturation, o.on_role_unavailable, o.connect_timeout_s) == (
        ov["onSaturation"], ov["onRoleUnavailable"], ov["connectTimeoutS"])
    assert o.api_key_env == (ov["apiKeyEnv"] or None)
    if ov["apiKeySecret"]["name"]:
        assert o.api_key_file == f"/etc/ray-llm-disagg/overflow-key/{ov['apiKeySecret']['key']}"
    else:
        assert o.api_key_file == (ov["apiKeyFile"] or None)
    assert "api_key_secret" not in args["overflow"], "chart-only key"
    # the admission queue fits under what Serve lets reach a frontend replica (the app's own split)
    in_flight, queued = cfg.admission_limits()
    assert in_flight + queued + (o.max_in_flight if o.enabled else 0) <= cfg.frontend.max_ongoing_requests
    # autoscaling: the values as they are (YAML's false is off); coupled mode adds the app-level policy, the same
    # one serve_app builds for the local stack
    av = v["autoscaling"]
    assert cfg.autoscaling.mode == ("off" if av["mode"] is False else av["mode"])
    for key in ("scaleDownBelow", "upscaleDelayS", "downscaleDelayS", "placementTimeoutS", "lookBackPeriodS"):
        assert getattr(cfg.autoscaling, snake(key)) == av[key], f"autoscaling.{key}"
    for block in ("prefill", "decode", "ratio"):
        for key, val in av[block].items():
            assert getattr(getattr(cfg.autoscaling, block), snake(key)) == val, f"autoscaling.{block}.{key}"
    assert ("autoscaling_policy" in app) == (cfg.autoscaling.mode == "coupled")
    if "autoscaling_policy" in app:
        want = cfg.app_autoscaling_policy()
        assert app["autoscaling_policy"]["policy_function"] == want["policy_function"]
        assert set(app["autoscaling_policy"]["policy_kwargs"]) == {"autoscaling"}
        kwargs = CoupledAutoscalingSpec.model_validate(app["autoscaling_policy"]["policy_kwargs"]["autoscaling"])
        assert kwargs == cfg.autoscaling, "the policy must get the app's own autoscaling section"
    return cfg


def check_service_account(r: Rendered) -> None:
    sas = [sa for sa in r.all("ServiceAccount") if not is_hook(sa)]
    if r.values["serviceAccount"]["create"]:
        assert [sa["metadata"]["name"] for sa in sas] == [service_account_name(r)]
        assert (sas[0]["metadata"].get("annotations") or {}) == r.values["serviceAccount"]["annotations"]
        assert sas[0]["automountServiceAccountToken"] is False
    else:
        assert not sas


def idle_timeout(v: dict) -> int:
    import math
    return math.ceil(max(v["timeouts"]["firstTokenS"], v["timeouts"]["betweenTokensS"])) + 30


def ingress_paths(values: dict) -> list[tuple[str, str]]:
    """What the Ingress must route: ingress.paths (Prefix unless given), else exactly the app's public routes."""
    if values["ingress"]["paths"]:
        return [(p["path"], p.get("pathType", "Prefix")) for p in values["ingress"]["paths"]]
    rp = values["serve"]["routePrefix"].rstrip("/")
    return [(f"{rp}/v1", "Prefix"), (f"{rp}/health", "Exact")]


def reaches_system_paths(path: str, path_type: str) -> bool:
    """Whether an Ingress path matches a request for Serve's own endpoints (/-/routes, /-/healthz)."""
    if path_type == "Exact":
        return path.startswith("/-/")
    first = [e for e in path.split("/") if e][:1]  # Prefix (and nginx's ImplementationSpecific) match by element
    return first in ([], ["-"])  # "/" or "/-...": covers /-/routes


def check_ingress(r: Rendered) -> None:
    v = r.values["ingress"]
    ings = r.all("Ingress")
    if not v["enabled"]:
        assert not ings
        return
    (ing,) = ings
    assert ing["apiVersion"] == "networking.k8s.io/v1"
    assert ing["spec"].get("ingressClassName") == (v["className"] or None)
    ann = ing["metadata"].get("annotations") or {}
    user = v.get("annotations") or {}
    idle = idle_timeout(r.values)
    if v["className"] == "alb":
        ports = ann["alb.ingress.kubernetes.io/listen-ports"]
        if v["tls"]:
            assert "HTTPS" in ports and "443" in ports, "TLS set: the ALB must listen on HTTPS 443"
            assert ann["alb.ingress.kubernetes.io/ssl-redirect"] == "443"
        else:
            assert ports == '[{"HTTP": 80}]'
            assert "alb.ingress.kubernetes.io/ssl-redirect" not in ann
        attrs = ann["alb.ingress.kubernetes.io/load-balancer-attributes"]
        secs = int(re.search(r"idle_timeout\.timeout_seconds=(\d+)", attrs)[1])
        assert secs >= idle > r.values["timeouts"]["firstTokenS"], "the ALB must not cut requests the app still serves"
        assert ann["alb.ingress.kubernetes.io/scheme"] == v["alb"]["scheme"]
    elif v["className"] == "nginx":
        for k in ("proxy-read-timeout", "proxy-send-timeout"):
            assert int(ann[f"nginx.ingress.kubernetes.io/{k}"]) >= idle
        assert ann["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"
    for k, val in user.items():
        if k != "alb.ingress.kubernetes.io/load-balancer-attributes":
            assert ann[k] == val
    (rule,) = ing["spec"]["rules"]
    assert rule.get("host") == (v["host"] or None)
    paths = rule["http"]["paths"]
    assert [(p["path"], p["pathType"]) for p in paths] == ingress_paths(r.values)
    for p in paths:
        assert p["backend"]["service"] == {"name": f"{fullname(r)}-serve-svc", "port": {"name": "serve"}}
        if not v["exposeSystemPaths"]:
            assert not reaches_system_paths(p["path"], p["pathType"]), f"{p} routes Serve's /-/ endpoints"
    assert (ing["spec"].get("tls") or []) == v["tls"]


def check_network_policy(r: Rendered) -> None:
    v = r.values
    nps = r.all("NetworkPolicy")
    if not v["networkPolicy"]["enabled"]:
        assert not nps
        return
    (np,) = nps
    spec = np["spec"]
    assert spec["podSelector"] == {"matchLabels": selector(r)}
    assert spec["policyTypes"] == ["Ingress"]
    rules = spec["ingress"]
    own = [x for x in rules if x.get("from") == [{"podSelector": {"matchLabels": selector(r)}}]]
    assert len(own) == 1 and "ports" not in own[0], "every port, but only from the release's own pods"
    serve = v["serve"]["port"]
    open_rules = [x for x in rules if "from" not in x]
    for x in open_rules:  # a rule without `from` admits everyone: only the serve port may have one
        assert x["ports"] == [{"port": serve, "protocol": "TCP"}]
    serve_from = v["networkPolicy"]["serve"]["from"]
    if serve_from:
        assert not open_rules
        assert any(x.get("from") == serve_from and x["ports"] == [{"port": serve, "protocol": "TCP"}] for x in rules)
    else:
        assert len(open_rules) == 1
    dashboard = ray_ports(v, "head")["dashboard"]
    op = [x for x in rules if {"port": dashboard, "protocol": "TCP"} in x.get("ports", [])]
    assert len(op) == 1 and {"port": serve, "protocol": "TCP"} in op[0]["ports"]
    (peer,) = op[0]["from"]
    assert peer["namespaceSelector"] == v["networkPolicy"]["operator"]["namespaceSelector"]
    assert peer.get("podSelector") == (v["networkPolicy"]["operator"]["podSelector"] or None)
    metrics = {ray_ports(v, g)["metrics"] for g in groups_of(v)}
    m = [x for x in rules if x.get("from") == v["networkPolicy"]["metrics"]["from"] and
         {p["port"] for p in x.get("ports", [])} == metrics]
    assert len(m) == (1 if v["networkPolicy"]["metrics"]["from"] else 0)
    for extra in v["networkPolicy"]["extraIngress"]:
        assert extra in rules
    # nothing else: every Ray port (GCS, dashboard, client, object manager, workers, NIXL) only for the release
    assert len(rules) == 3 + len(m) + len(v["networkPolicy"]["extraIngress"]), rules


def pods_floor(v: dict, role: str) -> int:
    rv = v[role]
    replicas = rv["autoscaling"]["minReplicas"] if rv["autoscaling"]["enabled"] else rv["replicas"]
    return replicas * hosts(v, role)


def check_pdbs(r: Rendered) -> None:
    v = r.values
    pdbs = {p["metadata"]["name"]: p for p in r.all("PodDisruptionBudget")}
    want = [g for g in groups_of(v) if v[g]["podDisruptionBudget"]["enabled"]]
    assert sorted(pdbs) == sorted(f"{fullname(r)}-{g}" for g in want)
    for g in want:
        spec = pdbs[f"{fullname(r)}-{g}"]["spec"]
        pods = 1 if g == "head" else pods_floor(v, g)
        # an integer minAvailable, never maxUnavailable: RayClusters have no scale subresource
        assert "maxUnavailable" not in spec
        assert spec["minAvailable"] == max(0, pods - v[g]["podDisruptionBudget"]["maxUnavailable"])
        assert isinstance(spec["minAvailable"], int)
        assert spec["selector"] == {"matchLabels": group_selector(r, g)}
        assert group_template(r, g)["metadata"]["labels"].items() >= spec["selector"]["matchLabels"].items()
        assert spec["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


def serve_url(r: Rendered) -> str:
    """The OpenAI API inside the cluster: serve Service, port, route prefix."""
    v = r.values
    return f"http://{fullname(r)}-serve-svc.{namespace(v)}.svc:{v['serve']['port']}{v['serve']['routePrefix'].rstrip('/')}"


def is_hook(d: dict) -> bool:
    return bool((d["metadata"].get("annotations") or {}).get("helm.sh/hook"))


def check_test_hook(r: Rendered) -> None:
    t = r.values["tests"]
    pods = [p for p in r.all("Pod") if is_hook(p) and p["metadata"]["name"].endswith("-test-models")]
    if not t["enabled"]:
        assert not pods
        return
    (pod,) = pods
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    for k, val in t["podAnnotations"].items():
        assert pod["metadata"]["annotations"][k] == val
    c = container(pod)
    assert c["image"] == f"{t['image']['repository']}:{t['image']['tag']}"
    assert c["resources"] == t["resources"]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["URL"] == f"{serve_url(r)}/v1/models"
    assert env["MODEL_ID"] == r.values["model"]["id"]
    keys = r.values["auth"]["apiKeySecret"]
    assert env["API_KEY_FILE"] == (f"/etc/api-keys/{keys['key']}" if keys["name"] else "")
    assert pod["spec"]["restartPolicy"] == "Never"
    assert (pod["spec"].get("nodeSelector") or {}) == t["nodeSelector"]


def check_efa_preflight(r: Rendered) -> None:
    v = r.values
    p = v["tests"]["efaPreflight"]
    name = f"{fullname(r)}-efa-preflight"
    hooks = [d for d in r.docs if is_hook(d) and d["metadata"]["name"] == name]
    if not p["enabled"]:
        assert not hooks
        return
    assert sorted(d["kind"] for d in hooks) == ["ConfigMap", "Pod", "Role", "RoleBinding", "ServiceAccount"]
    kind = {d["kind"]: d for d in hooks}
    pod = kind["Pod"]
    assert pod["spec"]["serviceAccountName"] == name
    assert kind["Role"]["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]
    (term,) = pod["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == group_selector(r, "decode"), "next to a decode pod"
    assert (pod["spec"].get("tolerations") or []) == v["decode"]["tolerations"]
    c = container(pod)
    assert c["image"] == image_of(v)
    args = dict(a.lstrip("-").split("=", 1) for a in c["args"])
    assert args["url"] == serve_url(r)
    assert args["model"] == v["model"]["id"]
    sel = dict(kv.split("=") for kv in args["decode-selector"].split(","))
    assert sel == group_selector(r, "decode")
    assert int(args["prompt-tokens"]) > v["remotePrefillMinTokens"], "the canary must go through prefill"
    assert int(args["metrics-port"]) == ray_ports(v, "decode")["metrics"]
    script = (CHART / "files" / "efa_preflight.py").read_text()
    assert kind["ConfigMap"]["data"]["efa_preflight.py"].strip() == script.strip()


def extra_object_names(r: Rendered) -> set[str]:
    names = set()
    for obj in r.values["extraObjects"]:
        doc = obj if isinstance(obj, dict) else yaml.safe_load(obj.replace("{{ .Release.Name }}", r.release))
        names.add(doc["metadata"]["name"].replace("{{ .Release.Name }}", r.release))
    return names


def check_extra_objects(r: Rendered) -> None:
    rendered = {d["metadata"]["name"]: d for d in r.docs}
    for name in extra_object_names(r):
        assert name in rendered, f"extraObjects entry {name} not rendered"
    for obj in r.values["extraObjects"]:
        if isinstance(obj, dict):  # maps go through tpl too
            doc = rendered[obj["metadata"]["name"]]
            assert "{{" not in yaml.safe_dump(doc)
