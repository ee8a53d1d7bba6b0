"""Prefill/decode failures under load (serve_app/engine/failover.py, serve_app/README.md "Failure semantics").

- a hung prefill engine (SIGSTOP): answered within the prefill deadline, by decode itself;
- KV that cannot be loaded (prefill killed after it answered, before decode pulled the KV): recomputed
  on decode, the client gets a normal answer;
- a prefill replica killed (SIGKILL) under load: zero failed requests, every TTFT within 10 s;
- a decode replica killed with two decode replicas: requests sent after the kill are served within 10 s,
  and the streams that were on it end (an error event and [DONE]) instead of hanging.
Each test waits for Serve to bring every replica back and for the normal path to serve again.
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import Callable

import httpx
import psutil
import pytest
from .resilience_helpers import (
    PREFILL_TIMEOUT_S,
    ROUTING_TIMEOUT_S,
    Load,
    Outcome,
    engine_core,
    long_prompt,
    measured,
    node_metrics,
    replica_processes,
    running_replicas,
    scrape,
    settled,
    stream_chat,
    total,
    wait_until,
)

from devstack.stack import LocalStack

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

# Bounds on TTFT during a fault are derived from the TTFT the same requests get just before it, on this
# machine, now (issue 22: constants failed at load 16-22 on 2 cores): the fault may add TTFT_SLACK_S plus a few
# normal requests' time (the requests queued behind it), never a timeout's worth.
TTFT_SLACK_S = 10.0
RECOVERY_S = 600  # a replica restart loads a vLLM engine: a minute or more on 2 busy cores
PREFILL, DECODE = "Prefill:tiny", "Decode:tiny"


def failovers(stack: LocalStack, **labels: str) -> float:
    return total(node_metrics(stack, "decode"), "ray_rld_prefill_failovers_total", **labels)


def served_by_path(stack: LocalStack, path: str) -> float:
    return total(node_metrics(stack, "decode"), "ray_rld_requests_total", role="decode", path=path)


def summary(outcomes: list[Outcome]) -> str:
    return "\n".join(o.describe() for o in sorted(outcomes, key=lambda o: o.started))


def worst_ttft(outcomes: list[Outcome]) -> float:
    return max(o.ttft_s or float("inf") for o in outcomes)


def ttft_bound(request: Callable[[], Outcome]) -> tuple[float, float]:
    """(bound, baseline): the worst TTFT of three such requests now, and TTFT_SLACK_S + 3x that."""
    baseline = [request() for _ in range(3)]
    assert all(o.ok for o in baseline), summary(baseline)
    return TTFT_SLACK_S + 3 * worst_ttft(baseline), worst_ttft(baseline)


def wait_for_full_strength(stack: LocalStack, http: httpx.Client) -> None:
    """Every replica of main RUNNING again, and a long prompt served on the remote path again."""
    wait_until(
        "prefill x1 and decode x2 RUNNING",
        lambda: running_replicas("main", PREFILL) == 1 and running_replicas("main", DECODE) == 2,
        timeout_s=RECOVERY_S,
        every_s=3,
    )
    remote_before = served_by_path(stack, "remote")

    def remote_again() -> bool:
        outcome = stream_chat(http)
        assert outcome.ok, outcome.describe()
        return served_by_path(stack, "remote") > remote_before

    # Decode skips a prefill replica for failover.suspect_s after it failed; then the remote path is back.
    wait_until("a request served with remote prefill again", remote_again, timeout_s=120, every_s=5)


def test_hung_prefill_is_answered_within_its_deadline(stack: LocalStack, http: httpx.Client) -> None:
    wait_for_full_strength(stack, http)
    # What a request costs on this machine right now, with every engine up (the machine may be loaded: the
    # bound below is derived from it, not a constant; issue 22).
    _, baseline_ttft = ttft_bound(lambda: stream_chat(http))
    (replica,) = replica_processes("main", PREFILL)
    core = engine_core(replica)
    before = failovers(stack, reason="timeout", served_by="fallback")
    core.suspend()  # SIGSTOP: the prefill replica still answers Serve, its engine never does
    try:
        with Load(lambda: stream_chat(http), interval_s=1.0) as load:
            time.sleep(8)
    finally:
        core.resume()
    outcomes = load.outcomes
    # The deadline, then a local prefill on decode: each of the ~8 requests queued behind it costs at most a few
    # normal requests' time on top.
    limit = PREFILL_TIMEOUT_S + ROUTING_TIMEOUT_S + 5 + 3 * baseline_ttft
    measured(
        f"\nhung prefill: {len(outcomes)} requests, worst TTFT {worst_ttft(outcomes):.2f} s (bound {limit:.1f} s; "
        f"before: worst TTFT {baseline_ttft:.2f} s)\n{summary(outcomes)}"
    )
    assert outcomes and all(o.ok for o in outcomes), summary(outcomes)
    assert worst_ttft(outcomes) <= limit, summary(outcomes)
    # The deadline was really what answered: someone waited for it, and decode counted the fallback.
    assert worst_ttft(outcomes) >= PREFILL_TIMEOUT_S, summary(outcomes)
    wait_until(
        "prefill timeouts served by fallback in ray_rld_prefill_failovers_total",
        lambda: failovers(stack, reason="timeout", served_by="fallback") > before,
        timeout_s=30,
    )
    wait_for_full_strength(stack, http)


def test_kv_that_cannot_be_loaded_is_recomputed(stack: LocalStack, http: httpx.Client) -> None:
    """Order the failure exactly: decode's engines paused, prefill answers (KV ready on prefill), prefill
    dies, decode's engines resume and cannot pull the KV. kv_transfer.load_failure_policy: recompute."""
    wait_for_full_strength(stack, http)
    (prefill,) = replica_processes("main", PREFILL)
    decode_cores = [engine_core(r) for r in replica_processes("main", DECODE)]
    prefill_url, decode_url = stack.cluster.metrics_url("prefill"), stack.cluster.metrics_url("decode")
    prefilled_before = total(settled(prefill_url), "ray_vllm_request_success_total")
    before = settled(decode_url)
    for core in decode_cores:
        core.suspend()
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pending = pool.submit(stream_chat, http)  # a long prompt: the remote path
            wait_until(
                "prefill to finish the request (its KV waits for decode)",
                lambda: total(scrape(prefill_url), "ray_vllm_request_success_total") > prefilled_before,
                timeout_s=60,
            )
            prefill.kill()
            time.sleep(2)
            for core in decode_cores:
                core.resume()
            outcome = pending.result(timeout=180)
    finally:
        for core in decode_cores:
            if core.is_running() and core.status() == psutil.STATUS_STOPPED:
                core.resume()
    measured(f"\nKV load failure: {outcome.describe()}")
    assert outcome.ok, outcome.describe()
    wait_until(
        "decode to count the recomputed prompt",
        lambda: total(scrape(decode_url), "ray_vllm_prompt_tokens_by_source_total", source="local_compute")
        - total(before, "ray_vllm_prompt_tokens_by_source_total", source="local_compute") > 250,
        timeout_s=30,
    )
    after = settled(decode_url)
    received = total(after, "ray_vllm_prompt_tokens_by_source_total", source="external_kv_transfer") - total(
        before, "ray_vllm_prompt_tokens_by_source_total", source="external_kv_transfer"
    )
    assert received == 0, f"{received} prompt tokens still came from the dead prefill engine"
    wait_for_full_strength(stack, http)


def test_prefill_replica_killed_under_load_fails_no_request(stack: LocalStack, http: httpx.Client) -> None:
    wait_for_full_strength(stack, http)
    fallback_before = served_by_path(stack, "fallback")
    bound, baseline = ttft_bound(lambda: stream_chat(http))
    (replica,) = replica_processes("main", PREFILL)
    with Load(lambda: stream_chat(http), interval_s=1.0) as load:
        time.sleep(5)
        replica.kill()  # SIGKILL the prefill replica actor (its engine goes with it)
        killed = time.monotonic()
        time.sleep(25)
    outcomes = load.outcomes
    after = [o for o in outcomes if o.started >= killed]
    measured(
        f"\nprefill killed: {len(outcomes)} requests ({len(after)} after the kill), "
        f"worst TTFT {worst_ttft(outcomes):.2f} s (bound {bound:.1f} s; before: {baseline:.2f} s)\n{summary(outcomes)}"
    )
    assert len(outcomes) >= 25 and len(after) >= 20
    failed = [o for o in outcomes if not o.ok]
    assert not failed, summary(failed)
    assert worst_ttft(outcomes) <= bound, summary(outcomes)
    assert all(o.backend == "cluster" for o in outcomes)  # served by this cluster, not overflow
    wait_until(
        "requests prefilled locally on decode (path=fallback)",
        lambda: served_by_path(stack, "fallback") > fallback_before,
        timeout_s=30,
    )
    wait_for_full_strength(stack, http)


def test_decode_replica_killed_new_requests_served_promptly(stack: LocalStack, http: httpx.Client) -> None:
    wait_for_full_strength(stack, http)
    replicas = replica_processes("main", DECODE)
    assert len(replicas) == 2
    victim = replicas[0]

    def long_stream() -> Outcome:
        # Long enough that some streams are mid-flight on the victim when it dies, short enough that the
        # load mostly stays under the admission limit. On a loaded machine requests last longer, more are in
        # flight at once and a few overflow to the external endpoint (saturation, as configured): those are
        # served, but say nothing about this cluster, so the checks below are on the cluster's requests.
        return stream_chat(http, prompt=long_prompt(), max_tokens=100, extra={"ignore_eos": True})

    bound, baseline = ttft_bound(long_stream)
    with Load(long_stream, interval_s=1.0) as load:
        time.sleep(6)
        victim.kill()
        killed = time.monotonic()
        time.sleep(25)
    outcomes = load.outcomes
    failed_after = [o for o in outcomes if o.started >= killed and not o.ok]
    overflowed = [o for o in outcomes if o.backend == "external"]  # a failure without the header stays below
    outcomes = [o for o in outcomes if o.backend != "external"]
    after = [o for o in outcomes if o.started >= killed]
    during = [o for o in outcomes if o.started < killed]
    measured(
        f"\ndecode killed: {len(outcomes)} requests on the cluster ({len(overflowed)} overflowed), "
        f"{len(after)} sent after the kill, worst TTFT of those {worst_ttft(after):.2f} s (bound {bound:.1f} s; "
        f"before: {baseline:.2f} s)\n{summary(outcomes + overflowed)}"
    )
    assert not failed_after, summary(failed_after)
    assert len(after) >= 15, summary(outcomes + overflowed)
    assert worst_ttft(after) <= bound, summary(after)
    # Streams that were on the dead replica end promptly: finished, or an error event then [DONE].
    for outcome in during:
        assert outcome.status == 200 and outcome.events and outcome.events[-1] == "[DONE]", outcome.describe()
    measured(f"decode killed: streams cut by the kill (error event, then [DONE]): {sum(o.error_event for o in during)} of {len(during)}")
    assert not psutil.pid_exists(victim.pid) or victim.status() == psutil.STATUS_ZOMBIE
    wait_for_full_strength(stack, http)
