"""Live values (serve_app.config.LIVE_FIELDS): what a running app takes without restarting a replica.

Serve replaces every replica of an app whose args change, engines included; a deployment's user_config is
applied in place by the replica's `reconfigure`. So the chart (and devstack) pass the live fields as every
deployment's user_config. Checked here: the config's split and merge, the deployment names the chart uses
against the app Ray actually builds, and an ingress whose limits and timeouts change under it."""

from __future__ import annotations

import asyncio
import itertools
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import ray

from devstack.serve_config import local_app_args
from serve_app.builder import build_app
from serve_app.config import LIVE_FIELDS, AppConfig, LiveConfigError, parse_live
from serve_app.engine.direct import LocalServerHandle
from serve_app.frontend.app import ENDPOINTS, make_app
from serve_app.frontend.ingress import REMOTE, BoundedOpenAiIngress
from serve_app.upstream import ModelCard, serve_build_app

from .test_frontend_app import KEYS, MODEL, FakeEngine, answer, no_serve  # noqa: F401 - no_serve: autouse fixture


def config(mode: str = "disaggregated", **overrides: Any) -> AppConfig:
    args = local_app_args("/models/tiny", mode=mode)
    for path, value in overrides.items():
        node = args
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return AppConfig.model_validate(args)


# ---- the config: split, merge, names ----


def test_static_args_and_user_config_make_the_same_app() -> None:
    full = config(**{"timeouts.first_token_s": 45, "limits.max_stop": 2, "remote_prefill_min_tokens": 7})
    static = full.static_args()
    assert not set(static) & set(LIVE_FIELDS)
    for entry in full.serve_deployments():
        assert AppConfig.model_validate(static).with_live(entry["user_config"]) == full


def test_aggregated_apps_have_no_remote_prefill_threshold_to_change() -> None:
    assert set(config("aggregated").live()) == {"timeouts", "limits"}
    assert set(config().live()) == set(LIVE_FIELDS)


def test_a_user_config_replaces_only_the_fields_it_sets() -> None:
    base = config(**{"timeouts.first_token_s": 45, "limits.max_stop": 2})
    changed = base.with_live({"limits": {"max_stop": 3}})
    assert changed.limits.max_stop == 3 and changed.timeouts == base.timeouts
    assert changed.remote_prefill_min_tokens == base.remote_prefill_min_tokens
    assert base.with_live(None) is base and base.with_live({}) is base


@pytest.mark.parametrize(
    "user_config, named",
    [
        ({"timeouts": {"first_token_s": 0}}, "timeouts.first_token_s"),
        ({"limits": {"max_stop": "many"}}, "limits.max_stop"),
        ({"remote_prefill_min_tokens": -1}, "remote_prefill_min_tokens"),
        ({"admission": {"max_in_flight": 3}}, "admission"),  # not live: an args change, refused here
        ({"timeouts": {"first_token": 3}}, "timeouts.first_token"),
    ],
)
def test_a_bad_user_config_is_refused_naming_the_key(user_config: dict[str, Any], named: str) -> None:
    with pytest.raises(LiveConfigError) as info:
        config().with_live(user_config)
    assert named in str(info.value) and "user_config" in str(info.value)
    with pytest.raises(LiveConfigError):
        parse_live(user_config)


def test_a_user_config_that_is_not_a_mapping_is_refused() -> None:
    with pytest.raises(LiveConfigError, match="expected a mapping"):
        parse_live(["timeouts"])  # type: ignore[arg-type]


@pytest.mark.parametrize("mode, direct", list(itertools.product(["disaggregated", "aggregated"], [False, True])))
def test_deployment_names_are_the_ones_the_app_builds(mode: str, direct: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The chart names each deployment in serveConfigV2 (its user_config); Serve refuses a name the app lacks."""
    # Ray's LLMServer options read the driver's runtime env, which would start a local Ray (and leave its auth
    # token in ~/.ray for later clusters to trip on): building needs no cluster, so there is none.
    monkeypatch.setenv("RAY_ENABLE_AUTO_CONNECT", "0")
    monkeypatch.setattr(ray, "get_runtime_context", lambda: SimpleNamespace(runtime_env={}))
    app = config(mode, **{"frontend.direct_streaming": direct, "model.id": "org/Tiny-1.5b"})
    built = serve_build_app(build_app(app), name="live")
    assert sorted(d.name for d in built.deployments) == sorted(app.deployment_names())
    for deployment in built.deployments:  # Serve calls reconfigure with the user_config: each has one
        assert callable(getattr(deployment.func_or_class, "reconfigure", None)), deployment.name
    assert not ray.is_initialized()


# ---- an ingress whose live values change under it ----


class Frontend:
    """make_app + BoundedOpenAiIngress over a fake engine, as the direct-streaming replica wires them."""

    def __init__(self, engine: FakeEngine, app_config: AppConfig) -> None:
        card = ModelCard(id=MODEL, object="model", owned_by="test", permission=[],
                         metadata={"model_id": MODEL, "input_modality": "text", "max_request_context_length": 2048})
        self.ingress = BoundedOpenAiIngress({MODEL: LocalServerHandle(engine)}, {MODEL: card}, lora_paths={},
                                            app_config=app_config, upstream=REMOTE)
        self.app = make_app(app_config)
        self.ingress.bind_app(self.app)
        for name, route in ENDPOINTS.items():
            route(self.app)(getattr(self.ingress, name))

    def post(self, body: Any) -> httpx.Response:
        async def go() -> httpx.Response:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url="http://test",
                                         headers={"Authorization": f"Bearer {KEYS[0]}"}) as c:
                return await c.post("/v1/completions", json=body)

        return asyncio.run(go())


def frontend(engine: FakeEngine) -> Frontend:
    app_config = AppConfig.model_validate({
        "mode": "aggregated", "model": {"id": MODEL, "source": "/m"}, "decode": {},
        "auth": {"api_keys_env": "RLD_UNIT_KEYS"},
    })
    return Frontend(engine, app_config)


BODY = {"model": MODEL, "prompt": "hello", "max_tokens": 4}


def test_new_limits_apply_from_the_next_request() -> None:
    f = frontend(FakeEngine(lambda n, request, raw: answer(request)))
    stops = {**BODY, "stop": ["a", "b"]}
    big = {**BODY, "prompt": "x" * 3000}
    assert f.post(stops).status_code == 200 and f.post(big).status_code == 200
    f.ingress.reconfigure({"limits": {"max_stop": 1, "max_body_bytes": 2048}})
    refused = f.post(stops)
    assert refused.status_code == 400 and "stop" in refused.json()["error"]["message"], refused.text
    too_big = f.post(big)  # the body limit is the middleware's: it reads the live value too
    assert too_big.status_code == 413 and "2048" in too_big.json()["error"]["message"], too_big.text
    f.ingress.reconfigure({"limits": {}})  # back to the defaults
    assert f.post(stops).status_code == 200 and f.post(big).status_code == 200


def test_new_timeouts_apply_from_the_next_request() -> None:
    f = frontend(FakeEngine(lambda n, request, raw: answer(request, delay_s=0.6)))
    assert f.post(BODY).status_code == 200
    f.ingress.reconfigure({"timeouts": {"first_token_s": 0.2, "non_stream_per_token_s": 0.01}})
    late = f.post(BODY)
    assert late.status_code == 503 and late.headers.get("retry-after"), late.text


def test_a_bad_user_config_leaves_the_ingress_as_it_was() -> None:
    f = frontend(FakeEngine(lambda n, request, raw: answer(request)))
    with pytest.raises(LiveConfigError, match="limits.max_stop"):
        f.ingress.reconfigure({"limits": {"max_stop": -1}})
    assert f.post({**BODY, "stop": ["a", "b"]}).status_code == 200
