"""AppConfig -> Ray LLMConfig mapping, validated by Ray's real LLMConfig / PDServingArgs models (fast: no cluster)."""

from __future__ import annotations

from typing import Any

import pytest

from serve_app.upstream import PDServingArgs
from serve_app.builder import AppConfigError, llm_configs, parse_app_config
from serve_app.config import DEFAULT_ROLE_LABEL_KEY, AppConfig
from serve_app.llm_configs import EDGE_CALLBACK, EDGE_CALLBACK_ENV
from devstack.serve_config import local_app_args


def gpu_args(**overrides: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "model": {"id": "llama-70b", "source": "s3://models/llama-70b"},
        "accelerator": "gpu",
        "kv_transfer": {"connector": "NixlConnector", "backend": "LIBFABRIC", "buffer_device": "cuda"},
        "prefill": {"replicas": 2, "tensor_parallel_size": 4, "accelerator_type": "H100",
                    "engine_args": {"max_model_len": 8192}},
        "decode": {
            "autoscaling": {"min_replicas": 1, "max_replicas": 4},
            "tensor_parallel_size": 8,
            "accelerator_type": "H200",
            "engine_args": {"max_model_len": 8192},
            "engine_env": {"NCCL_DEBUG": "WARN"},
        },
        "engine_env": {"FI_PROVIDER": "efa", "NCCL_DEBUG": "INFO"},
    }
    args.update(overrides)
    return args


def test_gpu_disaggregated_roles_map_to_ray_llm_configs() -> None:
    configs = llm_configs(parse_app_config(gpu_args()))
    prefill, decode = configs["prefill"], configs["decode"]

    assert prefill.model_id == decode.model_id == "llama-70b"
    # one accelerator type per role (prefill on p5, decode on p5en)
    assert prefill.accelerator_type == "H100" and prefill.accelerator_config.kind == "gpu"
    assert decode.accelerator_type == "H200"
    # GPU bundles: one per TP x PP rank, tagged with the accelerator type by Ray.
    assert prefill.get_engine_config().placement_bundles == [{"GPU": 1, "accelerator_type:H100": 0.001}] * 4
    assert decode.get_engine_config().placement_bundles == [{"GPU": 1, "accelerator_type:H200": 0.001}] * 8

    for role, config, kv_role in (("prefill", prefill, "kv_producer"), ("decode", decode, "kv_consumer")):
        assert config.engine_kwargs["kv_transfer_config"] == {
            "kv_connector": "NixlConnector",
            "kv_connector_module_path": "serve_app.engine.nixl",
            "kv_role": kv_role,
            "kv_buffer_device": "cuda",
            "kv_connector_extra_config": {"backends": ["LIBFABRIC"]},
            "kv_load_failure_policy": "recompute",
        }
        assert config.deployment_config["placement_group_bundle_label_selector"] == [{DEFAULT_ROLE_LABEL_KEY: role}]

    assert prefill.engine_kwargs["tensor_parallel_size"] == 4 and prefill.engine_kwargs["max_model_len"] == 8192
    assert prefill.deployment_config["num_replicas"] == 2
    assert "num_replicas" not in decode.deployment_config
    assert decode.deployment_config["autoscaling_config"]["max_replicas"] == 4
    assert "enabled" not in decode.deployment_config["autoscaling_config"]
    # App-wide env, overridden per role.
    edge = {EDGE_CALLBACK_ENV: EDGE_CALLBACK}  # Serve's own HTTP server gets the edge guard (issue 18)
    assert prefill.runtime_env["env_vars"] == {**edge, "FI_PROVIDER": "efa", "NCCL_DEBUG": "INFO"}
    assert decode.runtime_env["env_vars"] == {**edge, "FI_PROVIDER": "efa", "NCCL_DEBUG": "WARN"}
    # Ray's own P/D validation accepts the pair and gives decode its own NIXL port base.
    pd = PDServingArgs.model_validate({"prefill_config": prefill, "decode_config": decode})
    assert pd.decode_config.experimental_configs["NIXL_SIDE_CHANNEL_PORT_BASE"] == 22000


def test_cpu_local_args_map_to_cpu_bundles_and_loopback_env() -> None:
    args = local_app_args("/models/tiny", side_channel_ports={"prefill": 20100, "decode": 22100})
    configs = llm_configs(AppConfig.model_validate(args))
    for role, core in (("prefill", "0"), ("decode", "1")):
        config = configs[role]
        assert config.accelerator_config.kind == "cpu" and config.accelerator_type is None
        assert config.get_engine_config().placement_bundles == [{"CPU": 1}]
        env = config.runtime_env["env_vars"]
        assert env["VLLM_CPU_OMP_THREADS_BIND"] == core
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "127.0.0.1" and env["UCX_NET_DEVICES"] == "lo"
        assert config.engine_kwargs["kv_transfer_config"]["kv_buffer_device"] == "cpu"
        assert config.engine_kwargs["enforce_eager"] is True
    # NixlConnector: the role's port is a base Ray offsets per replica, never one fixed env port.
    for role, base in (("prefill", 20100), ("decode", 22100)):
        assert configs[role].experimental_configs["NIXL_SIDE_CHANNEL_PORT_BASE"] == base
        assert "VLLM_NIXL_SIDE_CHANNEL_PORT" not in configs[role].runtime_env["env_vars"]
    # Ray's P/D validation keeps our decode base instead of its default 22000.
    pd = PDServingArgs.model_validate({"prefill_config": configs["prefill"], "decode_config": configs["decode"]})
    assert pd.decode_config.experimental_configs["NIXL_SIDE_CHANNEL_PORT_BASE"] == 22100


def test_aggregated_mode_has_one_engine_without_kv_connector() -> None:
    configs = llm_configs(AppConfig.model_validate(local_app_args("/models/tiny", mode="aggregated")))
    assert list(configs) == ["decode"]
    assert "kv_transfer_config" not in configs["decode"].engine_kwargs


def test_disabled_autoscaling_block_means_fixed_replicas() -> None:
    """The chart mirrors its values as they are: a disabled autoscaling block keeps `replicas`."""
    args = gpu_args()
    args["decode"] = {**args["decode"], "replicas": 3,
                      "autoscaling": {"enabled": False, "min_replicas": 1, "max_replicas": 4}}
    decode = llm_configs(parse_app_config(args))["decode"]
    assert decode.deployment_config["num_replicas"] == 3
    assert "autoscaling_config" not in decode.deployment_config


def test_frontend_options() -> None:
    from serve_app.llm_configs import frontend_deployment_config

    app = parse_app_config(gpu_args(frontend={"replicas": 2, "num_cpus": 0.5, "max_ongoing_requests": 64},
                                    placement={"frontend_label": {"pool": "cpu"}}))
    assert frontend_deployment_config(app) == {
        "num_replicas": 2, "max_ongoing_requests": 64,
        "ray_actor_options": {"num_cpus": 0.5, "label_selector": {"pool": "cpu"},
                              "runtime_env": {"env_vars": {EDGE_CALLBACK_ENV: EDGE_CALLBACK}}}}


def test_frontend_replicas_per_node_reach_serve_only_when_set() -> None:
    """Serve's `max_replicas_per_node` keeps the frontend replicas on different Ray nodes (the chart sets 1);
    unset, Serve's best-effort spreading applies (and a cluster's first node can take them all)."""
    from ray import serve

    from serve_app.llm_configs import frontend_deployment_config

    spread = frontend_deployment_config(parse_app_config(gpu_args(frontend={"replicas": 2, "max_replicas_per_node": 1})))
    assert spread["max_replicas_per_node"] == 1
    serve.deployment(lambda: None).options(**spread)  # Serve's own options check accepts what we render
    assert "max_replicas_per_node" not in frontend_deployment_config(parse_app_config(gpu_args()))
    with pytest.raises(AppConfigError, match="frontend.max_replicas_per_node"):
        parse_app_config(gpu_args(frontend={"max_replicas_per_node": 0}))


def test_unpinned_roles_have_no_label_selector() -> None:
    configs = llm_configs(parse_app_config(gpu_args(placement={"pin_roles": False})))
    assert all("placement_group_bundle_label_selector" not in c.deployment_config for c in configs.values())


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"accelerator": "cpu"}, "prefill.accelerator_type"),
        ({"accelerator": "cpu", "prefill": {"replicas": 1}, "decode": {"replicas": 1}}, "buffer_device"),
        ({"accelerator_type": "H100"}, "accelerator_type"),  # per role now, not app-wide
        ({"allow_prefill_tp_greater_than_decode": True}, "allow_prefill_tp_greater_than_decode"),
        ({"prefill": {"engine_args": {"kv_transfer_config": {}}}}, "kv_transfer"),
        ({"prefill": None}, "prefill: required"),
        ({"decode": {"replica": 1}}, "replica"),
    ],
)
def test_invalid_args_fail_at_build_time_naming_the_field(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(AppConfigError, match=message):
        parse_app_config(gpu_args(**overrides))


def test_ray_rejects_an_unknown_accelerator_type() -> None:
    with pytest.raises(ValueError, match="H1000"):
        llm_configs(parse_app_config(gpu_args(decode={"tensor_parallel_size": 8, "accelerator_type": "H1000"})))


def test_a_role_can_share_a_gpu_with_fractional_bundles() -> None:
    args = gpu_args(mode="aggregated", prefill=None,
                    decode={"gpu_fraction": 0.25, "accelerator_type": "H100", "engine_args": {"gpu_memory_utilization": 0.2}})
    decode = llm_configs(parse_app_config(args))["decode"]
    bundles = decode.get_engine_config().placement_bundles
    assert bundles == [{"GPU": 0.25, "accelerator_type:H100": 0.001}]
    # Ray Serve LLM tells vLLM its share (VLLM_RAY_PER_WORKER_GPUS) from the fractional bundle.
    assert decode.get_engine_config().get_runtime_env_with_local_env_vars()["env_vars"][
        "VLLM_RAY_PER_WORKER_GPUS"] == "0.25"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"decode": {"gpu_fraction": 0.5, "tensor_parallel_size": 2}}, "gpu_fraction"),
        ({"decode": {"gpu_fraction": 0}}, "gpu_fraction"),
        ({"accelerator": "cpu", "mode": "aggregated", "prefill": None, "decode": {"gpu_fraction": 0.5}},
         "gpu_fraction"),
    ],
)
def test_gpu_sharing_that_cannot_work_is_refused(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(AppConfigError, match=message):
        parse_app_config(gpu_args(**overrides))
