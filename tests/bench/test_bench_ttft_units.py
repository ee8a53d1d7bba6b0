"""The GPU benchmark's pieces that run without a GPU: its app args, vLLM flags and dummy model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.gpu.model import dummy_model
from bench.servers import engine_cli_args
from bench.ttft import gpu_app_args, parse_args
from serve_app.builder import llm_configs, parse_app_config
from devstack.tiny_model import ensure_tiny_model

ENGINE = {"max_model_len": 8512, "max_num_batched_tokens": 8512, "gpu_memory_utilization": 0.35,
          "load_format": "dummy", "dtype": "bfloat16"}


@pytest.mark.parametrize("mode", ["aggregated", "disaggregated"])
def test_gpu_app_args_are_a_valid_app_with_the_same_engine_arguments(mode: str) -> None:
    args = gpu_app_args("/models/m8b", mode=mode, role_label_key="ray-llm-disagg.io/role",
                        side_channel_ports={"prefill": 16100, "decode": 16120}, model_id="m8b", engine=ENGINE,
                        env={"VLLM_USE_FLASHINFER_SAMPLER": "0"}, overrides={"streaming.batch_interval_ms": 20})
    configs = llm_configs(parse_app_config(args))  # Ray's own LLMConfig validates each role
    assert set(configs) == ({"decode"} if mode == "aggregated" else {"prefill", "decode"})
    for config in configs.values():
        for key, value in ENGINE.items():
            assert config.engine_kwargs[key] == value
        assert config.experimental_configs["stream_batching_interval_ms"] == 20
        assert config.runtime_env["env_vars"]["VLLM_USE_FLASHINFER_SAMPLER"] == "0"


def test_engine_arguments_become_vllm_serve_flags() -> None:
    flags = engine_cli_args({"max_model_len": 8512, "enforce_eager": True, "enable_prefix_caching": False,
                             "kv_transfer_config": {"kv_connector": "NixlConnector"}})
    assert flags == ["--max-model-len", "8512", "--enforce-eager", "--kv-transfer-config",
                     '{"kv_connector": "NixlConnector"}']


def test_the_dummy_model_has_the_shape_and_the_tiny_tokenizer(tmp_path: Path) -> None:
    model = dummy_model("llama3-8b", tmp_path / "m8b", 9000, ensure_tiny_model())
    config = json.loads((model / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_key_value_heads"]) == (4096, 32, 8)
    assert config["max_position_embeddings"] == 9000 and config["vocab_size"] == 2048
    assert (model / "tokenizer.json").is_file()


def test_cpu_runs_keep_prompts_inside_the_tiny_models_context() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--device", "cpu", "--lengths", "4096"])
    a = parse_args(["--device", "cpu"])
    assert a.model_id == "tiny" and max(a.lengths) + a.output_tokens < 2048
