"""The rendered serve args through the app's own builder: AppConfig -> one Ray Serve LLM `LLMConfig`
per role, validated by Ray itself. Needs the project venv (Ray + vLLM); skipped under a bare Python.
Slow only because of the `ray.serve.llm` import (shared with tests/serve_app in a full run)."""

from __future__ import annotations

import pytest

from .conftest import EXAMPLES, render

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def builder():
    pytest.importorskip("ray.serve.llm", reason="needs the project venv (hack/pyenv.sh)")
    from serve_app import builder

    return builder


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
@pytest.mark.parametrize("mode", ["disaggregated", "aggregated"])
def test_examples_build_ray_llm_configs(builder, example, mode):
    r = render([example], {"mode": mode})
    app = builder.parse_app_config(r.args)
    configs = builder.llm_configs(app)
    assert list(configs) == list(app.roles())
    for role, cfg in configs.items():
        v = r.values[role]
        assert cfg.engine_kwargs["tensor_parallel_size"] == v["tensorParallelSize"]
        assert cfg.engine_kwargs["pipeline_parallel_size"] == v["pipelineParallelSize"]
        for k, val in v["engineArgs"].items():
            assert cfg.engine_kwargs[k] == val
        if mode == "disaggregated":
            kv = cfg.engine_kwargs["kv_transfer_config"]
            assert kv["kv_connector"] == r.args["kv_transfer"]["connector"]
            assert kv["kv_connector_extra_config"]["backends"] == [r.args["kv_transfer"]["backend"]]
        # the Ray node label the chart puts on the group is the one the role's bundles select
        selector = cfg.deployment_config["placement_group_bundle_label_selector"]
        assert selector == [{r.values["placement"]["roleLabelKey"]: role}]
        assert r.groups[role]["labels"][r.values["placement"]["roleLabelKey"]] == role
