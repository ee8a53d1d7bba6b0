"""The local serve config: the serveConfigV2 shape the chart renders, with CPU/loopback AppConfig args.

Args are validated by AppConfig before anything is deployed, exactly as `build_app` will on the cluster.
"""

from __future__ import annotations

import copy
from typing import Any, Optional

from serve_app.config import DEFAULT_ROLE_LABEL_KEY, AppConfig

IMPORT_PATH = "serve_app.builder:build_app"
MODEL_ID = "tiny"
MAX_MODEL_LEN = 2048
# Prompts shorter than this stay on decode; a one-line chat message is about 15 tokens with the template.
REMOTE_PREFILL_MIN_TOKENS = 32

# Every engine: no hub, a 1 GiB CPU KV cache, NIXL side channel and UCX on loopback.
CPU_LOOPBACK_ENV = {
    "HF_HUB_OFFLINE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
    "UCX_NET_DEVICES": "lo",
}
CPU_ENGINE_ARGS = {"max_model_len": MAX_MODEL_LEN, "enforce_eager": True, "dtype": "bfloat16"}
# Two cores: prefill owns core 0, decode core 1 (an aggregated engine shares decode's core).
CORE_OF_ROLE = {"prefill": "0", "decode": "1"}


def _cpu_role(role: str, side_channel_port: Optional[int]) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "replicas": 1,
        "engine_args": dict(CPU_ENGINE_ARGS),
        "engine_env": {"VLLM_CPU_OMP_THREADS_BIND": CORE_OF_ROLE[role]},
    }
    if side_channel_port is not None:
        spec["side_channel_port"] = side_channel_port
    return spec


def local_app_args(
    model_path: str,
    *,
    mode: str = "disaggregated",
    role_label_key: str = DEFAULT_ROLE_LABEL_KEY,
    side_channel_ports: Optional[dict[str, int]] = None,
    remote_prefill_min_tokens: int = REMOTE_PREFILL_MIN_TOKENS,
) -> dict[str, Any]:
    """AppConfig args for the tiny model on CPU engines over loopback, validated."""
    ports = side_channel_ports or {}
    args: dict[str, Any] = {
        "mode": mode,
        "model": {"id": MODEL_ID, "source": model_path},
        "accelerator": "cpu",
        "decode": _cpu_role("decode", ports.get("decode")),
        "placement": {"role_label_key": role_label_key, "pin_roles": True},
        "frontend": {"replicas": 1, "num_cpus": 0},
        "engine_env": dict(CPU_LOOPBACK_ENV),
        "timeouts": {"first_token_s": 120, "between_tokens_s": 60},
    }
    if mode == "disaggregated":
        args["prefill"] = _cpu_role("prefill", ports.get("prefill"))
        args["kv_transfer"] = {"connector": "NixlConnector", "backend": "UCX", "buffer_device": "cpu"}
        args["remote_prefill_min_tokens"] = remote_prefill_min_tokens
    return AppConfig.model_validate(args).model_dump(mode="json", exclude_defaults=False)


def serve_deploy_config(applications: dict[str, dict[str, Any]], *, http_port: int) -> dict[str, Any]:
    """A ServeDeploySchema dict: one application per (route prefix -> AppConfig args).

    `applications` maps an app name to {"route_prefix": ..., "args": ...}.
    """
    def application(name: str, app: dict[str, Any]) -> dict[str, Any]:
        config = AppConfig.model_validate(app["args"])
        # as the chart renders it: the live fields are every deployment's user_config, not args
        entry = {"name": name, "route_prefix": app["route_prefix"], "import_path": IMPORT_PATH,
                 "args": config.static_args(), "deployments": config.serve_deployments()}
        policy = config.app_autoscaling_policy()  # autoscaling.mode coupled
        if policy is not None:
            entry["autoscaling_policy"] = policy
        return entry

    return {
        "proxy_location": "HeadOnly",  # every node shares one IP: one proxy, on the head
        "http_options": {"host": "127.0.0.1", "port": http_port},
        "applications": [application(name, app) for name, app in applications.items()],
    }


def with_overrides(args: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """`args` with each dotted AppConfig path of `overrides` set (e.g. {"streaming.batch_interval_ms": 0}),
    validated again by AppConfig."""
    if not overrides:
        return args
    result = copy.deepcopy(args)
    for path, value in overrides.items():
        node = result
        *parents, leaf = path.split(".")
        for part in parents:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            node = child
        node[leaf] = value
    return AppConfig.model_validate(result).model_dump(mode="json", exclude_defaults=False)
