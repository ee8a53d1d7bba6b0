"""The engine side (what a replica reports, from vLLM's own stats objects) and the configuration: AppConfig's
autoscaling section, the deployment configs it renders, and the serve config's application-level policy."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from serve_app.autoscaling import policy
from serve_app.autoscaling.signals import EngineSignals, attach
from serve_app.upstream import IterationStats, SchedulerStats, StatLoggerManager
from serve_app.config import COUPLED_POLICY_FUNCTION, AppConfig
from serve_app.llm_configs import role_llm_config


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def iteration(ttfts=(), itls=()) -> IterationStats:
    it = IterationStats()
    it.time_to_first_tokens_iter.extend(ttfts)
    it.inter_token_latencies_iter.extend(itls)
    return it


def test_engine_signals_from_vllm_stats():
    clock = Clock()
    sig = EngineSignals(window_s=10, clock=clock)
    sig.record(SchedulerStats(num_running_reqs=5, num_waiting_reqs=3, kv_cache_usage=0.42), iteration([1.0, 3.0], [0.1]))
    clock.t += 4
    sig.record(SchedulerStats(num_running_reqs=6, num_waiting_reqs=2, kv_cache_usage=0.5), iteration([], [0.3]))
    snap = sig.snapshot()
    assert snap == {policy.RUNNING: 6, policy.WAITING: 2, policy.KV_CACHE_USAGE: 0.5,
                    policy.TTFT_S: 2.0, policy.ITL_S: pytest.approx(0.2)}
    clock.t += 7  # the first step's samples (11 s old) leave the window
    snap = sig.snapshot()
    assert policy.TTFT_S not in snap, "no first token in the window: TTFT unknown, not 0"
    assert snap[policy.ITL_S] == pytest.approx(0.3)
    # an engine with no unfinished request: its last scheduler stats are stale
    assert sig.snapshot(idle=True)[policy.WAITING] == 0 and sig.snapshot(idle=True)[policy.KV_CACHE_USAGE] == 0


def test_attach_puts_it_on_the_list_vllm_records_every_step_to():
    class Engine:  # the one attribute of vLLM's AsyncLLM that attach uses, holding vLLM's real manager
        logger_manager = StatLoggerManager.__new__(StatLoggerManager)

    Engine.logger_manager.stat_loggers = []
    sig = attach(Engine)
    assert Engine.logger_manager.stat_loggers == [sig]
    Engine.logger_manager.record(SchedulerStats(num_waiting_reqs=7), None)  # what AsyncLLM's output loop calls
    assert sig.snapshot()[policy.WAITING] == 7


def test_attach_without_engine_stats_warns_and_reports_nothing(caplog):
    class Engine:
        logger_manager = None

    assert attach(Engine) is None
    assert "disable_log_stats" in caplog.text


def app(mode: str = "coupled", *, aggregated: bool = False, prefill_auto=True, decode_auto=True, **extra) -> dict:
    def role(auto: bool) -> dict:
        return {"replicas": 1, "autoscaling": {"enabled": auto, "min_replicas": 1, "max_replicas": 4}}

    args = {"model": {"id": "m", "source": "/m"}, "decode": role(decode_auto), "autoscaling": {"mode": mode, **extra}}
    if aggregated:
        args["mode"] = "aggregated"
    else:
        args["prefill"] = role(prefill_auto)
    return args


@pytest.mark.parametrize("args, message", [
    (app(prefill_auto=False), "prefill.autoscaling.enabled: autoscaling.mode coupled scales both roles"),
    (app(decode_auto=False), "decode.autoscaling.enabled: autoscaling.mode coupled scales both roles"),
    (app(aggregated=True), "autoscaling.mode: coupled scales prefill and decode together"),
    ({**app(), "prefill": {"autoscaling": {"enabled": True, "min_replicas": 0, "max_replicas": 2}}},
     "prefill.autoscaling.min_replicas: must be >= 1 with autoscaling.mode coupled"),
    (app("off"), "prefill.autoscaling.enabled: true conflicts with autoscaling.mode off"),
    (app("off", prefill_auto=False), "decode.autoscaling.enabled: true conflicts with autoscaling.mode off"),
    (app(ratio={"min": 2, "max": 1}), "autoscaling.ratio.min (2.0) must be <= autoscaling.ratio.max (1.0)"),
    (app(ratio={"max": 0.2}), "autoscaling.ratio.max (0.2): prefill.autoscaling.min_replicas (1) over"),
    (app(ratio={"min": 5}), "autoscaling.ratio.min (5.0): prefill.autoscaling.max_replicas (4) over"),
    (app(scale_down_below=1), "scale_down_below"),
    (app(look_back_period_s=8), "look_back_period_s"),  # Ray 2.58 warns it will refuse <= metrics_interval_s
    (app("sometimes"), "autoscaling.mode"),
])
def test_bad_combinations_are_refused_naming_the_key(args, message):
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        AppConfig.model_validate(args)


def test_yaml_off_is_off():
    assert AppConfig.model_validate(app(False, prefill_auto=False, decode_auto=False)).autoscaling.mode == "off"


def test_per_deployment_mode_is_what_it_was():
    cfg = AppConfig.model_validate(app("perDeployment"))
    assert cfg.app_autoscaling_policy() is None
    auto = role_llm_config(cfg, "decode")["deployment_config"]["autoscaling_config"]
    assert auto == {"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 16}


def test_coupled_mode_renders_the_policy_and_hands_hysteresis_to_it():
    cfg = AppConfig.model_validate(app(look_back_period_s=12, decode={"itl_s": 0.05}))
    pol = cfg.app_autoscaling_policy()
    assert pol["policy_function"] == COUPLED_POLICY_FUNCTION
    assert pol["policy_kwargs"]["autoscaling"]["decode"]["itl_s"] == 0.05
    for role in ("prefill", "decode"):
        auto = role_llm_config(cfg, role)["deployment_config"]["autoscaling_config"]
        assert (auto["upscale_delay_s"], auto["downscale_delay_s"], auto["look_back_period_s"]) == (0, 0, 12)
        assert (auto["min_replicas"], auto["max_replicas"]) == (1, 4)
