"""Ray Serve's high-throughput mode (serve.highThroughput): the same environment on every Ray container."""

from __future__ import annotations

import pytest

from .conftest import container, env_of, render, render_error

MODE_ENV = {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
            "RAY_SERVE_HAPROXY_OBSERVE_ERROR_LIMIT": "1"}


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


@pytest.mark.parametrize("high_throughput", [True, False])
def test_every_ray_container_gives_serves_proxy_the_apps_edge_guards(high_throughput: bool) -> None:
    """Serve's proxy on each node (HAProxy's backup; every request without HAProxy) loads the app's edge
    middlewares, among them the 503 for a request held while the app's ingress has no running replica."""
    from serve_app.llm_configs import EDGE_CALLBACK, EDGE_CALLBACK_ENV

    for name, c in _ray_containers(render(values={"serve": {"highThroughput": high_throughput}})).items():
        assert env_of(c)[EDGE_CALLBACK_ENV]["value"] == EDGE_CALLBACK, name
    err = render_error(values={"extraEnv": [{"name": EDGE_CALLBACK_ENV, "value": "mine:middlewares"}]})
    assert EDGE_CALLBACK_ENV in err or "edge guards" in err


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
    """frontend.directStreaming becomes the app's frontend.direct_streaming (on unless set false; the app's own
    default agrees). The graph it builds (no frontend deployment) is deployed for real in tests/direct: building it
    here would start a local Ray in this process (Ray Serve LLM's builder reads the runtime context)."""
    from serve_app.config import AppConfig, FrontendSpec

    default = render(values={"mode": mode}).args
    assert AppConfig.model_validate(default).frontend.direct_streaming is True
    assert FrontendSpec().direct_streaming is True
    off = render(values={"mode": mode, "frontend": {"directStreaming": False}}).args
    assert off["frontend"]["direct_streaming"] is False
    assert AppConfig.model_validate(off).frontend.direct_streaming is False


def test_haproxy_gives_up_on_a_frontend_replica_that_vanished() -> None:
    """Ray's HAProxy config has no `timeout connect` unless told: on a real node, a request sent to the frontend
    replica of a pod that had just been deleted waited for ever (no SYN-ACK, no reset from a network namespace that
    is gone). The chart sets the connect timeout and a faster health check on every Ray container."""
    for name, c in _ray_containers(render()).items():
        env = env_of(c)
        assert env["RAY_SERVE_HAPROXY_TIMEOUT_CONNECT_S"]["value"] == "3", name
        assert env["RAY_SERVE_HAPROXY_HEALTH_CHECK_INTER"]["value"] == "2s", name
    custom = render(values={"serve": {"haproxyConnectTimeoutS": 10, "haproxyHealthCheckIntervalS": 4}})
    for name, c in _ray_containers(custom).items():
        assert env_of(c)["RAY_SERVE_HAPROXY_TIMEOUT_CONNECT_S"]["value"] == "10", name
        assert env_of(c)["RAY_SERVE_HAPROXY_HEALTH_CHECK_INTER"]["value"] == "4s", name
    for name, c in _ray_containers(render(values={"serve": {"highThroughput": False}})).items():
        assert "RAY_SERVE_HAPROXY_TIMEOUT_CONNECT_S" not in env_of(c), name


def test_haproxy_timeouts_are_validated_and_owned_by_the_chart() -> None:
    assert "haproxyConnectTimeoutS" in render_error(values={"serve": {"haproxyConnectTimeoutS": 0}})
    err = render_error(values={"extraEnv": [{"name": "RAY_SERVE_HAPROXY_TIMEOUT_CONNECT_S", "value": "0"}]})
    assert "serve.haproxyConnectTimeoutS" in err


def test_haproxy_replays_once_what_a_dead_frontend_replica_never_answered() -> None:
    """On a real node, a request in flight at the frontend replica of a deleted pod got HAProxy's 502 (no header
    received), rewritten by Ray to 500. The chart adds `empty-response` to Ray's `conn-failure` and bounds the
    replays to one, so such a request is answered by another replica and a request that kills its replica costs
    at most one more."""
    for name, c in _ray_containers(render()).items():
        env = env_of(c)
        assert env["RAY_SERVE_HAPROXY_RETRY_ON"]["value"] == "conn-failure empty-response", name
        assert env["RAY_SERVE_HAPROXY_RETRIES"]["value"] == "1", name
    off = render(values={"serve": {"haproxyRetryOn": "none", "haproxyRetries": 0}})
    for name, c in _ray_containers(off).items():
        assert env_of(c)["RAY_SERVE_HAPROXY_RETRY_ON"]["value"] == "none", name
        assert env_of(c)["RAY_SERVE_HAPROXY_RETRIES"]["value"] == "0", name
    for name, c in _ray_containers(render(values={"serve": {"highThroughput": False}})).items():
        assert "RAY_SERVE_HAPROXY_RETRY_ON" not in env_of(c), name


@pytest.mark.parametrize("bad", [
    {"haproxyRetryOn": "503"},                          # a status code: the app's 503 is an answer, not a failure
    {"haproxyRetryOn": "all-retryable-errors"},         # includes status codes
    {"haproxyRetryOn": "conn-failure; rm -rf /"},
    {"haproxyRetryOn": ""},
    {"haproxyRetries": 4},
    {"haproxyRetries": -1},
])
def test_haproxy_replay_values_are_validated(bad: dict) -> None:
    assert f"serve.{next(iter(bad))}" in render_error(values={"serve": bad}).replace("/serve/", "serve.")


def test_haproxy_replay_env_is_owned_by_the_chart() -> None:
    for name in ("RAY_SERVE_HAPROXY_RETRY_ON", "RAY_SERVE_HAPROXY_RETRIES"):
        err = render_error(values={"extraEnv": [{"name": name, "value": "x"}]})
        assert "serve.haproxyRetryOn" in err, name


def test_two_frontend_replicas_by_default() -> None:
    """One frontend replica is a single point of failure for the whole endpoint: the pod that holds it goes, every
    request waits for a new one. Two (Serve spreads them over nodes) leave one serving."""
    from serve_app.config import AppConfig

    assert AppConfig.model_validate(render().args).frontend.replicas == 2
