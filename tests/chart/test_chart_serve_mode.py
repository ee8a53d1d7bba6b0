"""Ray Serve's high-throughput mode (serve.highThroughput): the same environment on every Ray container."""

from __future__ import annotations

import pytest

from .conftest import container, env_of, render, render_error

MODE_ENV = {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"}


def _ray_containers(r) -> dict[str, dict]:  # type: ignore[no-untyped-def]
    pods = {"head": r.head["template"], **{name: g["template"] for name, g in r.groups.items()}}
    return {name: container(pod) for name, pod in pods.items()}


@pytest.mark.parametrize("mode", ["disaggregated", "aggregated"])
def test_high_throughput_is_the_default_on_every_ray_container(mode: str) -> None:
    r = render(values={"mode": mode})
    containers = _ray_containers(r)
    assert set(containers) == ({"head", "prefill", "decode"} if mode == "disaggregated" else {"head", "decode"})
    for name, c in containers.items():
        env = env_of(c)
        for key, value in MODE_ENV.items():
            assert env[key]["value"] == value, f"{name}: {key}"


def test_off_leaves_serves_python_proxy() -> None:
    for name, c in _ray_containers(render(values={"serve": {"highThroughput": False}})).items():
        assert not set(MODE_ENV) & set(env_of(c)), name


@pytest.mark.parametrize("where", ["extraEnv", "head"])
def test_the_modes_env_cannot_be_set_by_hand(where: str) -> None:
    entry = [{"name": "RAY_SERVE_ENABLE_HA_PROXY", "value": "0"}]
    values = {"extraEnv": entry} if where == "extraEnv" else {"head": {"extraEnv": entry}}
    err = render_error(values=values)
    assert "serve.highThroughput" in err


@pytest.mark.parametrize("mode", ["disaggregated", "aggregated"])
def test_direct_streaming_reaches_the_app(mode: str) -> None:
    """frontend.directStreaming becomes the app's frontend.direct_streaming (off unless set). The graph it
    builds (no frontend deployment) is deployed for real in tests/direct: building it here would start a
    local Ray in this process (Ray Serve LLM's builder reads the runtime context)."""
    from serve_app.config import AppConfig

    on = render(values={"mode": mode, "frontend": {"directStreaming": True}}).args
    assert on["frontend"]["direct_streaming"] is True
    assert AppConfig.model_validate(on).frontend.direct_streaming is True
    assert AppConfig.model_validate(render(values={"mode": mode}).args).frontend.direct_streaming is False
