"""AppConfig -> Ray Serve LLM arguments: one LLMConfig (as a dict) per engine role, plus the frontend's options.

Pure mapping, importable with pydantic only: the builder validates the dicts with Ray's real
`LLMConfig`, and the unit tests do the same. Both roles go through the same functions; the only
role-specific inputs are the RoleSpec and the KV role.
"""

from __future__ import annotations

from typing import Any, Optional

from serve_app.config import AppConfig, RoleSpec
from serve_app.frontend.edge import EDGE_CALLBACK, EDGE_CALLBACK_ENV  # Serve wraps its own HTTP servers in these

# vLLM kv_role per serving role in disaggregated mode. Aggregated mode has no KV connector.
KV_ROLE = {"prefill": "kv_producer", "decode": "kv_consumer"}
# Where vLLM loads the NIXL connector classes from: vLLM's own, with NIXL's busy UCX progress thread off
# (serve_app/engine/nixl.py says why). A string: this module stays importable without vLLM.
NIXL_CONNECTOR_MODULE = "serve_app.engine.nixl"
# not imported from serve_app.engine.cpu: that module asks for AMX on import (it is for vLLM workers)
CPU_WORKER_EXTENSION = "serve_app.engine.cpu.AmxPermission"


def kv_transfer_config(app: AppConfig, role: str) -> Optional[dict[str, Any]]:
    """vLLM KVTransferConfig for `role`, or None when the app does not move KV."""
    if app.mode != "disaggregated":
        return None
    kv = app.kv_transfer
    return {
        "kv_connector": kv.connector,
        "kv_connector_module_path": NIXL_CONNECTOR_MODULE,
        "kv_role": KV_ROLE[role],
        "kv_buffer_device": kv.buffer_device,
        "kv_connector_extra_config": {"backends": [kv.backend]},
        "kv_load_failure_policy": kv.load_failure_policy,
    }


def engine_kwargs(app: AppConfig, role: str, spec: RoleSpec) -> dict[str, Any]:
    kwargs: dict[str, Any] = dict(spec.engine_args)
    kwargs["tensor_parallel_size"] = spec.tensor_parallel_size
    kwargs["pipeline_parallel_size"] = spec.pipeline_parallel_size
    kv = kv_transfer_config(app, role)
    if kv is not None:
        kwargs["kv_transfer_config"] = kv
    if app.accelerator == "cpu":
        # each vLLM worker asks Linux for AMX before vLLM's bfloat16 attention uses it (serve_app.engine.cpu);
        # a worker extension the user set wins
        kwargs.setdefault("worker_extension_cls", CPU_WORKER_EXTENSION)
    return kwargs


def accelerator_fields(app: AppConfig, spec: RoleSpec) -> dict[str, Any]:
    """Accelerator kind, the role's accelerator type and the per-worker bundle Ray replicates TP x PP times."""
    if app.accelerator == "cpu":
        return {"accelerator_config": {"kind": "cpu"}, "placement_group_config": {"bundle_per_worker": {"CPU": 1}}}
    fields: dict[str, Any] = {
        "accelerator_config": {"kind": "gpu"},
        "placement_group_config": {"bundle_per_worker": {"GPU": spec.gpu_fraction}},
    }
    if spec.accelerator_type:
        fields["accelerator_type"] = spec.accelerator_type
    return fields


def deployment_config(app: AppConfig, role: str, spec: RoleSpec) -> dict[str, Any]:
    config: dict[str, Any] = {}
    if spec.autoscaled:
        assert spec.autoscaling is not None
        autoscaling = spec.autoscaling.model_dump(exclude={"enabled"})
        if app.autoscaling.mode == "coupled":
            # The application-level policy (serve_app/autoscaling) decides both roles, with its own hysteresis;
            # Ray's per-deployment delays would hold one role while the other moved and break their ratio.
            autoscaling.update(
                upscale_delay_s=0,
                downscale_delay_s=0,
                look_back_period_s=app.autoscaling.look_back_period_s,
            )
        config["autoscaling_config"] = autoscaling
    else:
        config["num_replicas"] = spec.replicas
    if app.placement.pin_roles:
        config["placement_group_bundle_label_selector"] = [{app.placement.role_label_key: role}]
    return config


def runtime_env(app: AppConfig, role: str, spec: RoleSpec) -> dict[str, Any]:
    env = {EDGE_CALLBACK_ENV: EDGE_CALLBACK, **app.engine_env, **spec.engine_env}
    if spec.side_channel_port is not None and _moves_kv(app) and app.kv_transfer.connector == "NixlPushConnector":
        # Ray 2.58 assigns no side-channel port for the push connector: one fixed port per engine.
        env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(spec.side_channel_port)
    return {"env_vars": env}


# experimental_configs keys serve_app's own servers read (Ray ignores unknown keys).
FIRST_CHUNK_IMMEDIATELY = "rld_first_chunk_immediately"
STREAM_MAX_MESSAGES_PER_S = "rld_stream_max_messages_per_s"
STREAM_MAX_INTERVAL_MS = "rld_stream_max_batch_interval_ms"
PREWARM = "_prewarm_prefill_decode"  # Ray's own key
PREWARM_TIMEOUT_S = "rld_prewarm_timeout_s"


def experimental_configs(app: AppConfig, role: str, spec: RoleSpec) -> dict[str, Any]:
    """Ray Serve LLM's per-deployment experimental settings, plus the ones our servers read."""
    configs: dict[str, Any] = {
        "stream_batching_interval_ms": app.streaming.batch_interval_ms,
        FIRST_CHUNK_IMMEDIATELY: app.streaming.first_chunk_immediately,
        STREAM_MAX_MESSAGES_PER_S: app.streaming.max_messages_per_s,
        STREAM_MAX_INTERVAL_MS: app.streaming.max_batch_interval_ms,
    }
    if _moves_kv(app) and role == "decode":
        configs[PREWARM] = app.kv_transfer.prewarm
        configs[PREWARM_TIMEOUT_S] = app.kv_transfer.prewarm_timeout_s
        configs["pd_tokenize_once"] = app.kv_transfer.tokenize_once
    if spec.side_channel_port is not None and _moves_kv(app) and app.kv_transfer.connector == "NixlConnector":
        # A base, not a port: Ray adds replica rank x TP x PP, so replicas on one node never collide.
        configs["NIXL_SIDE_CHANNEL_PORT_BASE"] = spec.side_channel_port
    return configs


def _moves_kv(app: AppConfig) -> bool:
    return app.mode == "disaggregated"


def role_llm_config(app: AppConfig, role: str) -> dict[str, Any]:
    """LLMConfig kwargs for one engine role of `app` (prefill or decode)."""
    spec = app.roles()[role]
    model_loading: dict[str, Any] = {"model_id": app.model.id, "model_source": app.model.source}
    if app.model.tokenizer_source:
        model_loading["tokenizer_source"] = app.model.tokenizer_source
    return {
        "model_loading_config": model_loading,
        **accelerator_fields(app, spec),
        "engine_kwargs": engine_kwargs(app, role, spec),
        "deployment_config": deployment_config(app, role, spec),
        "runtime_env": runtime_env(app, role, spec),
        "experimental_configs": experimental_configs(app, role, spec),
        "log_engine_metrics": app.engine_metrics,
    }


def frontend_deployment_config(app: AppConfig) -> dict[str, Any]:
    actor_options: dict[str, Any] = {
        "num_cpus": app.frontend.num_cpus,
        "runtime_env": {"env_vars": {EDGE_CALLBACK_ENV: EDGE_CALLBACK}},
    }
    if app.placement.frontend_label:
        actor_options["label_selector"] = dict(app.placement.frontend_label)
    config: dict[str, Any] = {
        "num_replicas": app.frontend.replicas,
        "max_ongoing_requests": app.frontend.max_ongoing_requests,
        "ray_actor_options": actor_options,
    }
    if app.frontend.max_replicas_per_node is not None:
        config["max_replicas_per_node"] = app.frontend.max_replicas_per_node
    return config
