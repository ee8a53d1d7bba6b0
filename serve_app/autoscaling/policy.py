"""The coupled prefill/decode scaling decision, as a pure function (no Ray, no clock, no I/O).

`decide(signals, spec, state, now)` takes what each role reports (`RoleSignals`: replicas running and targeted,
the role's bounds, and its engines' signals), the targets (`CoupledAutoscalingSpec`), the state that carries
hysteresis between calls (`PolicyState`) and the time, and returns each role's replica target with the reason.
`serve_app.autoscaling.ray_policy` feeds it from Ray Serve's `AutoscalingContext`; the unit tests feed it recorded
signal traces with their own clock.

Each role scales on the signal that limits it. Its pressure is the largest signal/target ratio:
  prefill  waiting requests per running replica, recent TTFT (queue + prefill)
  decode   KV-cache use, waiting sequences per running replica, recent ITL, (optionally) running sequences
           per replica
A latency (TTFT, ITL) counts only while the role holds at least `LATENCY_MIN_REQUESTS_PER_REPLICA` requests
(running + waiting) per replica: with fewer there is no queue or batch to split, and a latency over its target is the
engine's floor at this load (a long prompt's prefill, a step over long contexts), which no replica more lowers.
Above 1 (for `upscale_delay_s`): target = ceil(running x pressure), at once (fast). Below `scale_down_below`
on every signal for `downscale_delay_s` (and as long since the role's last scale-up): one replica less (slow).
In between: hold. Then, per role: never below the role's min or above its max; no scale-down while fewer
replicas run than the role's min (its healthy floor); no raise while the replicas it already asked for have not
all started within `placement_timeout_s` (its pool cannot place them: "not reachable"). Then the roles are
coupled: the prefill:decode ratio stays within `ratio.min`/`ratio.max` by raising the role that is short
(if it can be raised) or else holding the other one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Optional

from serve_app.config import CoupledAutoscalingSpec

ROLES = ("prefill", "decode")

# Custom autoscaling metrics each engine replica reports (record_autoscaling_stats; serve_app/autoscaling/signals.py).
WAITING = "rld_waiting"  # requests waiting in the engine's queue
RUNNING = "rld_running"  # sequences the engine is running
KV_CACHE_USAGE = "rld_kv_cache_usage"  # 0-1
TTFT_S = "rld_ttft_s"  # mean TTFT of the requests that got their first token recently (absent: none did)
ITL_S = "rld_itl_s"  # mean inter-token latency of recent decode steps (absent: none)
SIGNAL_KEYS = (WAITING, RUNNING, KV_CACHE_USAGE, TTFT_S, ITL_S)

# The latency signals, and the load under which they say nothing about replicas: a role whose replicas each hold
# fewer requests (running + waiting) than this has no queue or batch a replica more would split, so a TTFT or ITL
# over its target there is the engine's floor (the 16-core bench run of 2026-12-07 scaled decode on an ITL of 26 ms
# against 25 ms with nothing waiting and KV use under 1 %: each decode replica held about one 4-token request).
LATENCY_SIGNALS = ("ttft_s", "itl_s")
LATENCY_MIN_REQUESTS_PER_REPLICA = 2.0
REQUESTS_PER_REPLICA = "requests_per_replica"  # an input the decision reports (running + waiting), not a target


@dataclass(frozen=True)
class RoleSignals:
    """One role at one instant: its replicas, its bounds and its engines' signals (summed or averaged over the
    replicas that reported them, as named)."""

    running: int  # replicas running (healthy)
    target: int  # replicas Serve is currently asked to run
    min_replicas: int
    max_replicas: int
    reported: int = 0  # running replicas that reported engine signals
    waiting: float = 0.0  # sum over replicas
    running_seqs: float = 0.0  # sum over replicas
    kv_cache_usage: float = 0.0  # mean over replicas
    ttft_s: Optional[float] = None  # mean over replicas with recent first tokens; None: no recent first token
    itl_s: Optional[float] = None  # likewise for inter-token latencies


@dataclass
class RoleState:
    over_since: Optional[float] = None  # first call of the current run of calls over target
    under_since: Optional[float] = None  # first call of the current run of calls below the scale-down band
    last_up_at: Optional[float] = None
    pending_since: Optional[float] = None  # first call of the current run of calls with running < target


@dataclass
class PolicyState:
    roles: dict[str, RoleState] = field(default_factory=lambda: {r: RoleState() for r in ROLES})
    last_log_at: Optional[float] = None


@dataclass(frozen=True)
class RoleDecision:
    role: str
    current: int  # Serve's target before this decision
    target: int
    running: int
    pressure: float
    limiting: str  # the signal with the largest ratio, e.g. "ttft_s 3.1 / target 2"
    reason: str
    unreachable: bool
    inputs: dict[str, float]  # the signals, by name (per replica where the target is per replica), and the load
    targets: dict[str, float]
    ignored: tuple[str, ...] = ()  # latency signals over their target left out: too little load to split

    @property
    def action(self) -> str:
        return "up" if self.target > self.current else "down" if self.target < self.current else "hold"

    def describe(self) -> str:
        arrow = f"{self.current}->{self.target}" if self.target != self.current else f"hold {self.target}"
        return f"{self.role} {arrow} ({self.reason})"


@dataclass(frozen=True)
class Decision:
    roles: dict[str, RoleDecision]

    @property
    def targets(self) -> dict[str, int]:
        return {r: d.target for r, d in self.roles.items()}

    @property
    def changed(self) -> bool:
        return any(d.target != d.current for d in self.roles.values())

    def describe(self) -> str:
        return "; ".join(self.roles[r].describe() for r in ROLES if r in self.roles)


def role_inputs(role: str, s: RoleSignals, spec: CoupledAutoscalingSpec) -> tuple[dict[str, float], dict[str, float]]:
    """(signal values, their targets) by signal name; a signal without recent samples is left out."""
    per = max(s.running, 1)
    if role == "prefill":
        t = spec.prefill
        values = {"waiting_per_replica": s.waiting / per}
        targets = {"waiting_per_replica": t.waiting_per_replica, "ttft_s": t.ttft_s}
        if s.ttft_s is not None:
            values["ttft_s"] = s.ttft_s
    else:
        d = spec.decode
        values = {"kv_cache_usage": s.kv_cache_usage, "waiting_per_replica": s.waiting / per}
        targets = {"kv_cache_usage": d.kv_cache_usage, "waiting_per_replica": d.waiting_per_replica, "itl_s": d.itl_s}
        if s.itl_s is not None:
            values["itl_s"] = s.itl_s
        if d.running_per_replica is not None:
            values["running_per_replica"] = s.running_seqs / per
            targets["running_per_replica"] = d.running_per_replica
    return values, targets


def requests_per_replica(s: RoleSignals, replicas: int) -> float:
    """The role's requests (running + waiting) over `replicas` of it."""
    return (s.running_seqs + s.waiting) / max(replicas, 1)


def latency_counts(s: RoleSignals, replicas: int) -> bool:
    """Whether the role's latencies say anything about its replicas when it runs `replicas` of them: each would hold
    at least LATENCY_MIN_REQUESTS_PER_REPLICA requests."""
    return requests_per_replica(s, replicas) >= LATENCY_MIN_REQUESTS_PER_REPLICA


def _without_latency(values: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in values.items() if k not in LATENCY_SIGNALS}


def _pressure(values: dict[str, float], targets: dict[str, float]) -> tuple[float, str]:
    best, name = 0.0, "none"
    for key, value in values.items():
        if key not in targets:
            continue
        ratio = value / targets[key]
        if ratio > best:
            best, name = ratio, key
    if name == "none":
        return 0.0, "no load"
    return best, f"{name} {values[name]:.3g} / target {targets[name]:.3g}"


def _clamp(n: int, s: RoleSignals) -> int:
    return max(s.min_replicas, min(s.max_replicas, n))


def _role_decision(
    role: str, s: RoleSignals, spec: CoupledAutoscalingSpec, st: RoleState, now: float
) -> RoleDecision:
    values, targets = role_inputs(role, s, spec)
    # Scale-up reads the latencies only under load worth splitting over the replicas running; scale-down only if
    # one replica fewer would still leave too little (else a latency over target holds the role where it is).
    up_values = values if latency_counts(s, s.running) else _without_latency(values)
    down_values = values if latency_counts(s, s.running - 1) else _without_latency(values)
    pressure, limiting = _pressure(up_values, targets)
    ignored = tuple(k for k in LATENCY_SIGNALS if k in values and k not in up_values and values[k] > targets[k])
    load = requests_per_replica(s, s.running)
    if ignored:
        limiting += "; " + ", ".join(f"{k} {values[k]:.3g} over target {targets[k]:.3g}" for k in ignored) + (
            f" left out ({load:.2g} requests a replica: no queue or batch for a replica more to split)")
    values = {**values, REQUESTS_PER_REPLICA: round(load, 4)}
    current = s.target

    # Replicas asked for but not running: starting, or unplaceable once that lasts placement_timeout_s.
    if s.running < current:
        st.pending_since = st.pending_since if st.pending_since is not None else now
    else:
        st.pending_since = None
    unreachable = st.pending_since is not None and now - st.pending_since >= spec.placement_timeout_s

    def done(target: int, reason: str) -> RoleDecision:
        return RoleDecision(role, current, target, s.running, pressure, limiting, reason, unreachable, values, targets,
                            ignored)

    if s.running == 0 or s.reported == 0:
        st.over_since = st.under_since = None
        why = "no running replica yet" if s.running == 0 else "no engine signals reported yet"
        return done(_clamp(current, s), why)

    if pressure > 1:
        st.under_since = None
        st.over_since = st.over_since if st.over_since is not None else now
        if now - st.over_since < spec.upscale_delay_s:
            return done(_clamp(current, s), f"{limiting} over for {now - st.over_since:.0f} s of "
                        f"upscale_delay_s {spec.upscale_delay_s:g}")
        wanted = max(current, math.ceil(s.running * pressure - 1e-9))
        if wanted > current and unreachable:
            return done(_clamp(current, s), f"{limiting}, but {current - s.running} replica(s) asked "
                        f"for have not started in {now - st.pending_since:.0f} s: not reachable, not raising")
        target = _clamp(wanted, s)
        if target > current:
            st.last_up_at, st.over_since = now, None
            capped = " (max_replicas)" if wanted > s.max_replicas else ""
            return done(target, f"{limiting} = x{pressure:.2f}{capped}")
        if unreachable:
            why = (f"{current - s.running} replica(s) asked for have not started in {now - st.pending_since:.0f} s: "
                   "not reachable")
        elif current >= s.max_replicas:
            why = "at max_replicas"
        else:
            why = f"{current - s.running} replica(s) still starting"
        return done(_clamp(current, s), f"{limiting} = x{pressure:.2f}, {why}")

    st.over_since = None
    if pressure >= spec.scale_down_below:
        st.under_since = None
        return done(_clamp(current, s), f"{limiting}: within the band")
    down_pressure, down_limiting = _pressure(down_values, targets)
    if current > s.min_replicas and down_pressure >= spec.scale_down_below:
        # a latency left out at this many replicas would count at one fewer: no scale-down
        st.under_since = None
        return done(_clamp(current, s), f"{down_limiting} at {current - 1} replica(s), where it would count "
                    f"({requests_per_replica(s, current - 1):.2g} requests each): no scale-down")

    st.under_since = st.under_since if st.under_since is not None else now
    quiet_since = max(st.under_since, st.last_up_at if st.last_up_at is not None else st.under_since)
    if current <= s.min_replicas:
        return done(_clamp(current, s), f"{limiting}: low, at min_replicas")
    if s.running < s.min_replicas:
        return done(_clamp(current, s), f"{limiting}: low, but only {s.running} of min_replicas "
                    f"{s.min_replicas} running (healthy floor): no scale-down")
    if now - quiet_since < spec.downscale_delay_s:
        return done(_clamp(current, s), f"{limiting}: low for {now - quiet_since:.0f} s of "
                    f"downscale_delay_s {spec.downscale_delay_s:g}")
    st.under_since = now  # the next replica off waits another downscale_delay_s
    return done(_clamp(current - 1, s), f"{limiting}: every signal < {spec.scale_down_below:g} x target "
                f"for {spec.downscale_delay_s:g} s")


def _couple(
    p: RoleDecision, d: RoleDecision, ps: RoleSignals, ds: RoleSignals, spec: CoupledAutoscalingSpec
) -> tuple[RoleDecision, RoleDecision]:
    """Keep prefill/decode within spec.ratio: raise the role that is short when it can be, else hold the other."""
    lo, hi = spec.ratio.min, spec.ratio.max
    if hi is not None and p.target > hi * d.target:
        need = math.ceil(p.target / hi - 1e-9)
        if need <= ds.max_replicas and not (need > d.current and d.unreachable):
            d = replace(d, target=need,
                        reason=f"ratio.max {hi:g}: prefill {p.target} needs decode >= {need}; {d.reason}")
        else:
            cap = max(ps.min_replicas, math.floor(hi * d.target + 1e-9))
            p = replace(p, target=cap,
                        reason=f"ratio.max {hi:g}: decode cannot go above {d.target}, prefill held at {cap}; {p.reason}")
    if lo is not None and p.target < lo * d.target:
        need = math.ceil(lo * d.target - 1e-9)
        if need <= ps.max_replicas and not (need > p.current and p.unreachable):
            p = replace(p, target=need,
                        reason=f"ratio.min {lo:g}: decode {d.target} needs prefill >= {need}; {p.reason}")
        else:
            cap = max(ds.min_replicas, math.floor(p.target / lo + 1e-9))
            d = replace(d, target=cap,
                        reason=f"ratio.min {lo:g}: prefill cannot go above {p.target}, decode held at {cap}; {d.reason}")
    return p, d


def decide(
    signals: dict[str, RoleSignals], spec: CoupledAutoscalingSpec, state: PolicyState, now: float
) -> Decision:
    """Both roles' targets for `signals` at time `now`. Updates `state` (the hysteresis timers) in place."""
    missing = [r for r in ROLES if r not in signals]
    if missing:
        raise ValueError(f"coupled autoscaling needs both roles' signals; missing: {', '.join(missing)}")
    p = _role_decision("prefill", signals["prefill"], spec, state.roles["prefill"], now)
    d = _role_decision("decode", signals["decode"], spec, state.roles["decode"], now)
    p, d = _couple(p, d, signals["prefill"], signals["decode"], spec)
    for dec in (p, d):
        if dec.target > dec.current:  # a raise from the ratio counts as a scale-up for the hysteresis
            state.roles[dec.role].last_up_at = now
    return Decision({"prefill": p, "decode": d})
