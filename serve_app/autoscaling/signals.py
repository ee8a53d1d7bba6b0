"""What an engine replica reports for coupled autoscaling: its vLLM engine's own scheduler and latency stats.

vLLM's AsyncLLM hands every engine step's `SchedulerStats` (running and waiting requests, KV-cache use) and
`IterationStats` (the TTFTs and inter-token latencies of that step) to the stat loggers of its
`StatLoggerManager`, the ones that feed Prometheus. `EngineSignals` is one more logger on that list; it keeps
the latest scheduler stats and the latencies of the last `window_s`. The replica's `record_autoscaling_stats`
(Ray Serve's hook, called every few seconds; serve_app/engine/servers.py) returns `EngineSignals.snapshot()`,
which Ray averages over the look-back window and hands to the coupled policy (serve_app/autoscaling/ray_policy.py).

The engine sends stats only when it steps: once it has nothing to do, the last scheduler stats it sent are
stale, so a snapshot taken while the engine has no unfinished request reports 0 running, 0 waiting and an
empty KV cache.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Callable, Optional

from serve_app.autoscaling import policy
from serve_app.telemetry.logs import get_logger
from serve_app.upstream import StatLoggerBase

logger = get_logger(__name__)


class EngineSignals(StatLoggerBase):
    def __init__(self, vllm_config: Any = None, engine_index: int = 0, *, window_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._window_s = window_s
        self._clock = clock
        self._running = 0
        self._waiting = 0
        self._kv_usage = 0.0
        self._ttft: deque[tuple[float, float]] = deque()
        self._itl: deque[tuple[float, float]] = deque()

    def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
               engine_idx: int = 0) -> None:
        if scheduler_stats is not None:
            self._running = scheduler_stats.num_running_reqs
            self._waiting = scheduler_stats.num_waiting_reqs
            self._kv_usage = scheduler_stats.kv_cache_usage
        if iteration_stats is not None:
            now = self._clock()
            self._ttft.extend((now, v) for v in iteration_stats.time_to_first_tokens_iter)
            self._itl.extend((now, v) for v in iteration_stats.inter_token_latencies_iter)

    def log_engine_initialized(self) -> None:
        pass

    def snapshot(self, idle: bool = False) -> dict[str, float]:
        """The custom autoscaling metrics (serve_app.autoscaling.policy names them). TTFT/ITL are left out when
        no request had one within the window (nothing to say, not zero latency)."""
        now = self._clock()
        out: dict[str, float] = {
            policy.RUNNING: 0 if idle else self._running,
            policy.WAITING: 0 if idle else self._waiting,
            policy.KV_CACHE_USAGE: 0.0 if idle else self._kv_usage,
        }
        for key, samples in ((policy.TTFT_S, self._ttft), (policy.ITL_S, self._itl)):
            while samples and now - samples[0][0] > self._window_s:
                samples.popleft()
            if samples:
                out[key] = sum(v for _, v in samples) / len(samples)
        return out


def attach(engine_client: Any) -> Optional[EngineSignals]:
    """Add an EngineSignals to a running vLLM AsyncLLM's stat loggers; None (and a warning saying what to change)
    when the engine keeps no stats."""
    manager = getattr(engine_client, "logger_manager", None)
    loggers = getattr(manager, "stat_loggers", None)
    if not isinstance(loggers, list):
        logger.warning(
            "coupled autoscaling: this replica's vLLM engine keeps no stats (engine_args.disable_log_stats is "
            "true, or this vLLM has no AsyncLLM.logger_manager.stat_loggers), so it reports no queue, KV-cache or "
            "latency signals and the policy holds its role; remove disable_log_stats from the role's engine_args")
        return None
    signals = EngineSignals()
    loggers.append(signals)
    return signals


def idle(engine_client: Any) -> bool:
    processor = getattr(engine_client, "output_processor", None)
    count = getattr(processor, "get_num_unfinished_requests", None)
    return bool(count is not None and count() == 0)
