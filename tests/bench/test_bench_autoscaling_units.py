"""bench/autoscaling.py's decisions that need nothing running: the autoscaled arm's SLO-derived policy is a valid app
config, decode's sequence bound reaches its engine in both arms, and phase rates written as multiples of a probed
capacity become requests/s (or refuse to run without the probe)."""

from __future__ import annotations

import pytest

from bench.autoscaling import arm_overrides, capacities, parse_phases, replica_starts, with_capacity
from devstack.serve_config import local_app_args, with_overrides
from serve_app.builder import llm_configs, parse_app_config


def app(overrides: dict) -> object:
    return parse_app_config(with_overrides(local_app_args("/models/tiny"), overrides))


def test_the_slo_arm_scales_on_the_slo_and_both_arms_bound_decode() -> None:
    auto = app(arm_overrides("autoscaled", "floating", "slo", ttft_slo_s=5, tpot_slo_s=0.03, decode_max_seqs=8))
    assert auto.autoscaling.mode == "coupled"
    assert auto.autoscaling.prefill.ttft_s == 2.5 and auto.autoscaling.decode.itl_s == 0.03
    assert auto.autoscaling.decode.running_per_replica is None
    assert (auto.prefill.autoscaling.max_replicas, auto.decode.autoscaling.max_replicas) == (2, 2)
    fixed = app(arm_overrides("fixed", "floating", "slo", ttft_slo_s=5, tpot_slo_s=0.03, decode_max_seqs=8))
    assert fixed.autoscaling.mode != "coupled"
    for a in (auto, fixed):
        assert llm_configs(a)["decode"].engine_kwargs["max_num_seqs"] == 8
        assert "max_num_seqs" not in llm_configs(a)["prefill"].engine_kwargs
    test_arm = app(arm_overrides("autoscaled", "floating", "test"))
    assert test_arm.autoscaling.decode.running_per_replica == 4  # tests/autoscaling's fast trigger


def test_rates_written_as_multiples_of_capacity() -> None:
    phases = parse_phases("idle:10,prefill-heavy:60:x1.5,decode-heavy:60:x2,decode-b:30:3")
    cap = capacities(prefill_s=[0.2, 0.25, 0.3], decode_s=[2.0, 2.2, 1.9], decode_max_seqs=8)
    assert cap == {"prefill": 4.0, "decode": 4.0}
    rated = with_capacity(phases, cap)
    assert [p.rate for p in rated] == [None, 6.0, 8.0, 3.0]
    assert capacities([0.5], [2.0], None) == {"prefill": 2.0}  # no slot bound: decode has no capacity
    with pytest.raises(SystemExit, match="needs --probe"):
        with_capacity(phases, {})


def test_replica_starts_are_timed_from_the_first_starting_sample_to_the_running_rise() -> None:
    def at(t: float, running: int, starting: int) -> dict:
        return {"t_s": t, "replicas": {"prefill": running, "decode": 1}, "starting": {"prefill": starting, "decode": 0}}

    timeline = [at(0, 1, 0), at(2, 1, 1), at(4, 1, 1), at(6, 2, 0), at(8, 2, 0), at(10, 1, 0), at(12, 1, 1), at(14, 1, 1)]
    assert replica_starts(timeline, "prefill") == [{"t_s": 2, "seconds": 4}]  # the second start never finished
    assert replica_starts(timeline, "decode") == []


def test_a_checkpoint_keeps_the_finished_requests_and_goes_when_the_arm_ends(tmp_path, monkeypatch) -> None:
    import json
    from concurrent.futures import Future

    import bench.autoscaling as bench

    monkeypatch.setattr(bench, "CHECKPOINT_EVERY_S", 0.0)
    done, pending = Future(), Future()
    done.set_result({"i": 0, "error": None})
    path = tmp_path / "autoscaled-partial.json"
    cp = bench.Checkpoint(path, "autoscaled", [{"t_s": 0.0}], [done, pending])
    cp.maybe()
    saved = json.loads(path.read_text())
    assert saved["requests"] == [{"i": 0, "error": None}] and saved["requests_sent"] == 2
    assert saved["timeline"] == [{"t_s": 0.0}]
    cp.remove()
    assert not path.exists()


def test_a_cut_run_counts_its_sent_but_unfinished_requests_as_misses_and_leaves_out_the_unsent(tmp_path) -> None:
    import json

    import bench.autoscaling as bench

    phases = parse_phases("idle-start:1,prefill-heavy:10:2,decode-heavy:10:2")
    requests = bench.schedule(phases, {}, seed=3)
    assert len(requests) > 10
    (tmp_path / "plan.json").write_text(json.dumps({"phases": [vars(p) for p in phases], "probe": None,
                                                    "requests_per_arm": len(requests)}))
    finished = [{"i": q["i"], "phase": q["phase"], "kind": q["kind"], "t_sched": q["t_sched"], "client_wait_s": 0.0,
                 "error": None, "ttft_s": 0.1, "tpot_s": 0.01, "e2e_s": 1.0, "output_tokens": 4} for q in requests[:5]]
    (tmp_path / "fixed-partial.json").write_text(json.dumps(
        {"arm": "fixed", "requests_sent": 8, "requests": finished, "timeline": [{"t_s": 12.0}]}))
    planned: dict = {}
    arms = bench.arms_from_partial(tmp_path, planned, {}, seed=3)
    rs = arms["fixed"]["requests"]
    assert [r["i"] for r in rs] == list(range(8))  # five finished, three sent and unfinished, the rest never sent
    assert bench.attainment(rs, 2.0, 0.025) == 5 / 8
    assert all("not finished" in r["error"] for r in rs[5:]) and arms["fixed"]["cut_at_s"] == 12.0
    assert planned["requests"] == requests
    with pytest.raises(SystemExit, match="give the cut run's --seed"):
        bench.arms_from_partial(tmp_path, {}, {}, seed=4)
    (tmp_path / "results.json").write_text(json.dumps({"autoscaled": {"arm": "autoscaled", "requests": finished}}))
    both = bench.arms_from_partial(tmp_path, {}, {}, seed=3)  # an arm that finished before the cut is kept whole
    assert both["autoscaled"]["requests"] == finished and len(both["fixed"]["requests"]) == 8


def test_side_by_side_role_nodes_hold_the_fixed_replica_beside_the_autoscaled_maximum() -> None:
    import bench.autoscaling as bench

    fixed, auto = arm_overrides("fixed", "floating"), arm_overrides("autoscaled", "floating", targets="slo")
    cpus = {n.name: n.num_cpus for n in bench.role_nodes({"fixed": fixed, "autoscaled": auto})}
    assert cpus["prefill"] == cpus["decode"] == bench.CPUS_PER_REPLICA * 3  # 1 fixed + 2 autoscaled per role
    alone = {n.name: n.num_cpus for n in bench.role_nodes({"autoscaled": auto})}
    assert alone["prefill"] == alone["decode"] == bench.CPUS_PER_REPLICA * 2


def test_served_per_replica_is_timed_between_a_phases_first_and_last_finished_request_and_flags_bad_rates() -> None:
    import bench.autoscaling as bench

    phases = [{"name": "idle", "seconds": 10, "load": None, "rate_per_s": 0.0},
              {"name": "prefill-heavy", "seconds": 100, "load": "prefill", "rate_per_s": 30.0}]

    def req(i: int, end: float, error: str | None = None) -> dict:
        return {"i": i, "phase": "prefill-heavy", "kind": "prefill", "t_sched": end - 1.0, "e2e_s": 1.0,
                "error": error, "ttft_s": 0.5, "tpot_s": None}

    # 51 requests end 1 s apart from t=40 (a backlog held the client threads before): 50 gaps in 50 s -> 1/s;
    # failures do not count; two replicas RUNNING over that span -> 0.5/s a replica
    rs = [req(i, 40.0 + i) for i in range(51)] + [req(100 + i, 20.0, "HTTP 503") for i in range(5)]
    timeline = [{"t_s": float(t), "replicas": {"prefill": 1 if t < 40 else 2, "decode": 1}} for t in range(0, 120, 2)]
    got = bench.served({"requests": rs, "timeline": timeline}, phases)
    assert got == {"prefill-heavy": {"offered_per_s": 30.0, "served_per_s": 1.0, "mean_replicas": 2.0,
                                     "served_per_replica_per_s": 0.5}}
    few = bench.served({"requests": rs[:3], "timeline": timeline}, phases)["prefill-heavy"]
    assert few["served_per_s"] == 0.0  # too few finished to time a rate
    s = {"loaded_phases": ["prefill-heavy"], "arms": {"fixed": {"served": bench.served(
        {"requests": rs, "timeline": timeline}, [{**phases[1], "rate_per_s": 1.0}])}, "autoscaled": {"served": got}}}
    warnings = bench.sizing(s)
    assert any("fixed arm served what was offered" in w for w in warnings)  # one replica kept up
    # ... unless it kept up only by queueing: the offered rate served at TTFTs over target
    s["arms"]["fixed"]["phases"] = {"prefill-heavy": {"ttft_ok": 0.39}}
    assert not any("fixed arm served what was offered" in w for w in bench.sizing(s))
    del s["arms"]["fixed"]["phases"]
    assert any("past what its maximum of 2 serves" in w for w in warnings)  # 1/s of 30/s with two replicas
    # a second replica that never started does not hide it: one replica's 1/s, twice over, is still short of 30/s
    one = [{**x, "replicas": {"prefill": 1, "decode": 1}} for x in timeline]
    s["arms"]["autoscaled"]["served"] = bench.served({"requests": rs, "timeline": one}, phases)
    assert any("past what its maximum of 2 serves" in w for w in bench.sizing(s))
    # an arm that kept up raises nothing
    kept = bench.served({"requests": rs, "timeline": timeline}, [{**phases[1], "rate_per_s": 1.0}])
    assert bench.sizing({"loaded_phases": ["prefill-heavy"], "arms": {"autoscaled": {"served": kept}}}) == []


def test_a_cut_run_keeps_the_policy_decisions_and_the_machine_it_ran_on(tmp_path) -> None:
    import json

    import bench.autoscaling as bench

    events = [{"t_s": 12.0, "role": "prefill", "from": 1, "to": 2, "why": "waiting 10 > 2"}]
    cpu = [{"t_s": 30.0, "busy_cores": 15.5}]
    cp = bench.Checkpoint(tmp_path / "autoscaled-partial.json", "autoscaled", [{"t_s": 0.0}], [],
                          lambda: {"scale_events": events, "cpu": cpu})
    cp.last -= bench.CHECKPOINT_EVERY_S
    cp.maybe()
    phases = parse_phases("idle-start:1,prefill-heavy:5:1")
    n = len(bench.schedule(phases, {}, seed=1))
    there = {"cpus": 16, "cpu_model": "the lent machine's"}
    (tmp_path / "plan.json").write_text(json.dumps({"phases": [vars(p) for p in phases], "probe": None,
                                                    "requests_per_arm": n, "machine": there}))
    planned: dict = {}
    arms = bench.arms_from_partial(tmp_path, planned, {}, seed=1)
    assert arms["autoscaled"]["scale_events"] == events and arms["autoscaled"]["cpu"] == cpu
    assert planned["machine"] == there  # not the machine reading the files
    plan = json.loads((tmp_path / "plan.json").read_text())
    del plan["machine"]
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    planned = {}
    bench.arms_from_partial(tmp_path, planned, {}, seed=1)
    assert planned["machine"]["cpus"] is None and "not recorded" in planned["machine"]["note"]

    def broken() -> list:
        raise OSError("controller log gone")

    cp = bench.Checkpoint(tmp_path / "autoscaled-partial.json", "autoscaled", [], [], broken)
    cp.last -= bench.CHECKPOINT_EVERY_S
    cp.maybe()  # the requests are still written; the decisions are context
    saved = json.loads((tmp_path / "autoscaled-partial.json").read_text())
    assert saved["timeline"] == [] and "scale_events" not in saved
    assert bench.arms_from_partial(tmp_path, {}, {}, seed=1)["autoscaled"]["scale_events"] == []


def test_a_cpu_sample_counts_the_load_generator_beside_the_stacks_processes(monkeypatch) -> None:
    import time

    import bench.autoscaling as bench

    monkeypatch.setattr(bench, "CPU_WINDOW_S", 0.3)

    def busy_stack(window_s: float) -> dict:  # this process spins through the window, as client threads would
        end = time.monotonic() + window_s
        while time.monotonic() < end:
            pass
        return {"VLLM::EngineCore": 98.0, "ray::ServeReplica:fixed:Decode:tiny": 40.0, "raylet": 3.0}

    sampler = bench.CpuSampler(busy_stack, parse_phases("idle:10,prefill-heavy:60:1"), t0=time.perf_counter() - 12)
    x = sampler.sample()
    assert x["phase"] == "prefill-heavy" and 12 <= x["t_s"] < 20
    assert x["stack_pct"] == 141.0 and list(x["top_pct"]) == ["VLLM::EngineCore", "ray::ServeReplica:fixed:Decode:tiny",
                                                              "raylet"]
    assert x["load_generator_pct"] > 5  # the bench's own CPU time over the window, not the stack's
    assert 0 < x["busy_cores"] <= x["cores"]
