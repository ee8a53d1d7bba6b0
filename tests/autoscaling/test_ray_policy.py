"""The coupled policy inside Ray Serve's own autoscaling machinery, without a cluster.

Ray's pieces are the real ones: `AutoscalingPolicy` (how Serve imports and pickles the serve config's
`autoscaling_policy`), `_resolve_policy_callable` (instantiates it with `policy_kwargs`),
`_apply_app_level_autoscaling_config` (the wrapper Serve puts around an application-level policy: scaling
factors and upscale/downscale delays from each deployment's `autoscaling_config`), `AutoscalingConfig` and
`AutoscalingContext`. The deployment configs are the ones `serve_app.llm_configs` renders for coupled mode.
"""

from __future__ import annotations

import inspect

import logging
import pickle

import pytest
from ray import cloudpickle
from ray.serve.autoscaling_policy import _apply_app_level_autoscaling_config
from ray.serve.config import AutoscalingConfig, AutoscalingContext, AutoscalingPolicy

from serve_app.upstream import DeploymentID, ReplicaID
from serve_app.upstream import resolve_policy_callable as _resolve_policy_callable

from serve_app.autoscaling import policy
from serve_app.autoscaling.ray_policy import LOG_PREFIX, CoupledPolicy, signals_from_context
from serve_app.config import COUPLED_POLICY_FUNCTION, AppConfig
from serve_app.llm_configs import role_llm_config

APP = "llm"
NAMES = {"prefill": "Prefill:tiny", "decode": "Decode:tiny"}


def coupled_app(**autoscaling) -> AppConfig:
    role = {"replicas": 1, "autoscaling": {"enabled": True, "min_replicas": 1, "max_replicas": 4}}
    return AppConfig.model_validate({
        "model": {"id": "tiny", "source": "/m"}, "accelerator": "cpu",
        "kv_transfer": {"buffer_device": "cpu"}, "prefill": role, "decode": role,
        "autoscaling": {"mode": "coupled", **autoscaling},
    })


def context(app: AppConfig, role: str, *, running: int, target: int, per_replica: dict[str, float],
            now: float, state: dict | None = None) -> tuple[DeploymentID, AutoscalingContext]:
    dep = DeploymentID(name=NAMES[role], app_name=APP)
    replicas = [ReplicaID(unique_id=f"{role}-{i}", deployment_id=dep) for i in range(running)]
    config = AutoscalingConfig(**role_llm_config(app, role)["deployment_config"]["autoscaling_config"])
    metrics = {key: {r: value for r in replicas} for key, value in per_replica.items()}
    kwargs = dict(
        deployment_id=dep, deployment_name=dep.name, app_name=APP,
        current_num_replicas=running, target_num_replicas=target, running_replicas=replicas,
        total_num_requests=0.0, total_queued_requests=0.0,
        aggregated_metrics=metrics, raw_metrics={},
        capacity_adjusted_min_replicas=config.min_replicas, capacity_adjusted_max_replicas=config.max_replicas,
        policy_state=state or {}, last_scale_up_time=None, last_scale_down_time=None, current_time=now,
        config=config, total_pending_async_requests=0,
    )
    # Ray 2.58 has total_pending_async_requests, 2.60 does not: pass what the installed Ray's context takes
    accepted = inspect.signature(AutoscalingContext.__init__).parameters
    return dep, AutoscalingContext(**{k: v for k, v in kwargs.items() if k in accepted})


def ray_wrapped_policy(app: AppConfig):
    """What Serve's controller calls every control-loop tick for this app."""
    spec = AutoscalingPolicy(**app.app_autoscaling_policy())
    return _apply_app_level_autoscaling_config(_resolve_policy_callable(spec))


IDLE_SIGNALS = {policy.WAITING: 0, policy.RUNNING: 0, policy.KV_CACHE_USAGE: 0.0}


def test_serve_pickles_the_policy_by_reference_not_by_value():
    """Serve cloudpickles the module the import path names by value; entry.py only re-exports, so the class
    itself (and everything it uses) is pickled by reference and the controller imports it."""
    spec = AutoscalingPolicy(**coupled_app().app_autoscaling_policy())
    assert spec.policy_function == COUPLED_POLICY_FUNCTION
    assert spec.get_policy() is CoupledPolicy
    payload = spec.get_serialized_policy_def()
    assert len(payload) < 200, f"the policy travelled by value ({len(payload)} bytes)"  # by value: ~12 KB
    assert pickle.loads(payload) is CoupledPolicy and cloudpickle.loads(payload) is CoupledPolicy


def test_a_prefill_heavy_tick_scales_prefill_through_rays_wrapper_at_once():
    app = coupled_app()
    tick = ray_wrapped_policy(app)
    contexts = dict([
        context(app, "prefill", running=1, target=1, now=1000.0,
                per_replica={**IDLE_SIGNALS, policy.WAITING: 10, policy.TTFT_S: 6.0}),
        context(app, "decode", running=1, target=1, now=1000.0,
                per_replica={**IDLE_SIGNALS, policy.KV_CACHE_USAGE: 0.1, policy.ITL_S: 0.02}),
    ])
    decisions, state = tick(contexts)
    by_name = {dep.name: n for dep, n in decisions.items()}
    # ttft 6 / 2 = x3 -> 3 replicas, on this very tick: Ray's upscale delay is 0 in coupled mode
    assert by_name == {NAMES["prefill"]: 3, NAMES["decode"]: 1}
    assert set(state) == set(contexts)


def test_scale_down_waits_for_the_policys_delay_and_then_passes_rays_wrapper():
    app = coupled_app(downscale_delay_s=30)
    tick = ray_wrapped_policy(app)
    state: dict = {}
    results = []
    for t in (0.0, 10.0, 29.0, 31.0):
        contexts = dict([
            context(app, "prefill", running=1, target=1, now=t, per_replica=IDLE_SIGNALS,
                    state=state.get(DeploymentID(NAMES["prefill"], APP))),
            context(app, "decode", running=3, target=3, now=t, per_replica=IDLE_SIGNALS,
                    state=state.get(DeploymentID(NAMES["decode"], APP))),
        ])
        decisions, state = tick(contexts)
        results.append({dep.name: n for dep, n in decisions.items()}[NAMES["decode"]])
    assert results == [3, 3, 3, 2]


def test_signals_come_from_the_running_replicas_reports():
    app = coupled_app()
    dep, ctx = context(app, "decode", running=2, target=3, now=0.0,
                       per_replica={policy.WAITING: 3, policy.RUNNING: 5, policy.KV_CACHE_USAGE: 0.5})
    s = signals_from_context(ctx)
    assert (s.running, s.target, s.min_replicas, s.max_replicas, s.reported) == (2, 3, 1, 4, 2)
    assert (s.waiting, s.running_seqs, s.kv_cache_usage) == (6, 10, 0.5)
    assert s.ttft_s is None and s.itl_s is None  # no replica had recent samples


def test_every_change_is_logged_with_its_inputs(caplog):
    app = coupled_app()
    p = CoupledPolicy(app.autoscaling.model_dump(mode="json"), metrics=False)
    def tick(prefill_target: int, now: float):
        return p(dict([
            context(app, "prefill", running=1, target=prefill_target, now=now,
                    per_replica={**IDLE_SIGNALS, policy.RUNNING: 3, policy.TTFT_S: 5.0}),
            context(app, "decode", running=1, target=1, now=now, per_replica=IDLE_SIGNALS),
        ]))

    with caplog.at_level(logging.INFO, logger="ray.serve.serve_app.autoscaling"):
        tick(1, 5.0)
        tick(3, 6.0)  # Serve applied it; the replicas are starting: no change, not logged (log_every_s)
    lines = [r.getMessage() for r in caplog.records if LOG_PREFIX in r.getMessage()]
    assert len(lines) == 1, lines
    assert "prefill 1->3 (ttft_s 5 / target 2 = x2.50)" in lines[0] and "decode hold 1" in lines[0]
    assert '"ttft_s": 5.0' in lines[0] and '"replicas": 1' in lines[0] and '"requests_per_replica": 3.0' in lines[0]


def test_a_misconfigured_app_gets_no_decision_and_one_error(caplog):
    app = coupled_app()
    p = CoupledPolicy(app.autoscaling.model_dump(mode="json"), metrics=False)
    contexts = dict([context(app, "decode", running=1, target=1, now=0.0, per_replica=IDLE_SIGNALS)])
    with caplog.at_level(logging.ERROR, logger="ray.serve.serve_app.autoscaling"):
        assert p(contexts) == ({}, {})
        assert p(contexts) == ({}, {})
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "Prefill:<model>" in errors[0] and "Decode:tiny" in errors[0]


def test_bad_policy_kwargs_fail_when_serve_instantiates_the_policy():
    spec = AutoscalingPolicy(policy_function=COUPLED_POLICY_FUNCTION,
                             policy_kwargs={"autoscaling": {"mode": "coupled", "scale_down_below": 2}})
    with pytest.raises(ValueError, match="scale_down_below"):
        _resolve_policy_callable(spec)
