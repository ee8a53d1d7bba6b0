"""Ray Serve's application-level autoscaling policy for the coupled mode (runs in the Serve controller).

Ray 2.58 calls one policy per application with every autoscaled deployment's `AutoscalingContext` (their
`aggregated_metrics` hold what each replica's `record_autoscaling_stats` reported, averaged over
`look_back_period_s`) and applies the targets it returns within each deployment's min/max. This adapter maps
the deployments to roles (our builder names them `Prefill:<model>` and `Decode:<model>`), turns each context
into `RoleSignals`, asks `policy.decide`, then logs the decision with its inputs and exports it as metrics.
Ray instantiates the class once each time the app is (re)deployed, with `policy_kwargs` (the app's `autoscaling`
section), so the hysteresis state lives on the instance.
"""

from __future__ import annotations

import json
import time
from typing import Any, Optional

from serve_app.autoscaling import policy
from serve_app.autoscaling.policy import Decision, PolicyState, RoleSignals
from serve_app.config import ENGINE_DEPLOYMENT_PREFIX, CoupledAutoscalingSpec
from serve_app.telemetry.logs import get_logger

logger = get_logger("serve_app.autoscaling")

# The name prefixes serve_app.builder gives the role deployments.
DEPLOYMENT_PREFIX = {role: ENGINE_DEPLOYMENT_PREFIX[role] for role in ("prefill", "decode")}
LOG_PREFIX = "RLD_AUTOSCALE"


def role_of(deployment_name: str) -> Optional[str]:
    for role, prefix in DEPLOYMENT_PREFIX.items():
        if deployment_name.startswith(prefix):
            return role
    return None


def signals_from_context(ctx: Any) -> RoleSignals:
    """RoleSignals from one deployment's AutoscalingContext: counts summed over its running replicas, KV-cache
    use averaged over them, TTFT/ITL averaged over the replicas that had recent samples."""
    metrics = ctx.aggregated_metrics or {}
    running_ids = list(ctx.running_replicas or [])

    def per_replica(key: str) -> list[float]:
        by_replica = metrics.get(key) or {}
        return [float(by_replica[r]) for r in running_ids if r in by_replica and by_replica[r] is not None]

    def mean(values: list[float]) -> Optional[float]:
        return sum(values) / len(values) if values else None

    reported = len(per_replica(policy.KV_CACHE_USAGE))
    return RoleSignals(
        running=int(ctx.current_num_replicas),
        target=int(ctx.target_num_replicas),
        min_replicas=int(ctx.capacity_adjusted_min_replicas),
        max_replicas=int(ctx.capacity_adjusted_max_replicas),
        reported=reported,
        waiting=sum(per_replica(policy.WAITING)),
        running_seqs=sum(per_replica(policy.RUNNING)),
        kv_cache_usage=mean(per_replica(policy.KV_CACHE_USAGE)) or 0.0,
        ttft_s=mean(per_replica(policy.TTFT_S)),
        itl_s=mean(per_replica(policy.ITL_S)),
    )


class _Metrics:
    """The decision as Prometheus metrics (ray_rld_role_*), recorded in the controller through Ray's agent."""

    def __init__(self) -> None:
        from ray.util.metrics import Gauge

        keys = ("application", "role")
        self.target = Gauge("rld_role_target_replicas", "Replicas the coupled policy wants for the role.", keys)
        self.replicas = Gauge("rld_role_replicas", "Replicas of the role running (as the policy saw them).", keys)
        self.pressure = Gauge("rld_role_pressure", "The role's largest signal/target ratio (>1: over target).", keys)
        self.unreachable = Gauge(
            "rld_role_target_unreachable",
            "1 while replicas the role asked for have not started within placement_timeout_s.", keys)
        self.signal = Gauge("rld_role_signal", "A scaling input of the role, as the policy used it.",
                            (*keys, "signal"))
        self.signal_target = Gauge("rld_role_signal_target", "The target of a scaling input.", (*keys, "signal"))

    def record(self, app: str, decision: Decision) -> None:
        for role, d in decision.roles.items():
            tags = {"application": app, "role": role}
            self.target.set(d.target, tags)
            self.replicas.set(d.running, tags)
            self.pressure.set(d.pressure, tags)
            self.unreachable.set(1 if d.unreachable else 0, tags)
            for name, target in d.targets.items():
                self.signal_target.set(target, {**tags, "signal": name})
                self.signal.set(d.inputs.get(name, 0.0), {**tags, "signal": name})
            for name in d.inputs.keys() - d.targets.keys():  # the load latencies are read against (no target)
                self.signal.set(d.inputs[name], {**tags, "signal": name})


class CoupledPolicy:
    """`autoscaling_policy: {policy_function: serve_app.autoscaling.entry:CoupledPolicy, policy_kwargs:
    {autoscaling: <AppConfig.autoscaling>}}`. `clock` and `metrics` are for tests."""

    def __init__(self, autoscaling: Optional[dict[str, Any]] = None, *, clock=time.time, metrics: bool = True):
        self.spec = CoupledAutoscalingSpec.model_validate(autoscaling or {})
        self.state = PolicyState()
        self._clock = clock
        self._metrics_on = metrics
        self._metrics: Optional[_Metrics] = None
        self._complained = False

    def __call__(self, contexts: dict[Any, Any]) -> tuple[dict[Any, int], dict[Any, dict]]:
        by_role = {}
        for dep_id, ctx in contexts.items():
            role = role_of(ctx.deployment_name)
            if role is not None:
                by_role[role] = (dep_id, ctx)
        if set(by_role) != set(policy.ROLES):
            if not self._complained:
                names = sorted(ctx.deployment_name for ctx in contexts.values())
                logger.error(
                    "%s coupled autoscaling: expected autoscaled deployments %s<model> and %s<model>, found %s; "
                    "no decision is made (Ray keeps the current replicas). Both roles need autoscaling.enabled, and "
                    "the app must be built by serve_app.builder:build_app in mode disaggregated",
                    LOG_PREFIX, DEPLOYMENT_PREFIX["prefill"], DEPLOYMENT_PREFIX["decode"], names)
                self._complained = True
            return {}, {}
        first_ctx = by_role["prefill"][1]
        now = first_ctx.current_time if first_ctx.current_time is not None else self._clock()
        signals = {role: signals_from_context(ctx) for role, (_, ctx) in by_role.items()}
        decision = policy.decide(signals, self.spec, self.state, now)
        app = first_ctx.app_name or ""
        self._log(app, decision, signals, now)
        if self._metrics_on:
            if self._metrics is None:
                self._metrics = _Metrics()
            self._metrics.record(app, decision)
        return {by_role[role][0]: target for role, target in decision.targets.items()}, {}

    def _log(self, app: str, decision: Decision, signals: dict[str, RoleSignals], now: float) -> None:
        """A change is logged at once; an unchanged decision at most every spec.log_every_s."""
        last = self.state.last_log_at
        if not decision.changed and last is not None and now - last < self.spec.log_every_s:
            return
        self.state.last_log_at = now
        record = {
            "t": round(now, 3),
            "app": app,
            "changed": decision.changed,
            "roles": {
                role: {
                    "replicas": d.running, "from": d.current, "to": d.target,
                    "min": signals[role].min_replicas, "max": signals[role].max_replicas,
                    "pressure": round(d.pressure, 3), "unreachable": d.unreachable,
                    "inputs": {k: round(v, 4) for k, v in d.inputs.items()}, "targets": d.targets,
                }
                for role, d in decision.roles.items()
            },
        }
        logger.info("%s %s | %s", LOG_PREFIX, decision.describe(), json.dumps(record, sort_keys=True))
