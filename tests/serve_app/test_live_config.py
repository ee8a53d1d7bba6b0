"""Live values on a running app: the serve config deployed again with only the deployments' user_config changed
(what a `helm upgrade` of remotePrefillMinTokens, timeouts or limits renders) is applied in place. The frontend
enforces the new limits, decode takes the new remote-prefill threshold, and no Serve replica was replaced (same
actors: no engine restarted). The original values are put back for the suites that share this stack."""

from __future__ import annotations

from typing import Any

import httpx

from devstack.serve_config import MODEL_ID
from devstack.stack import LocalStack

from .serve_helpers import wait_until
from .test_local_app import DecodeEngine, long_prompt

APP = "disagg"


def completion(http: httpx.Client, **body: Any) -> httpx.Response:
    return http.post("/v1/completions", json={"model": MODEL_ID, "max_tokens": 2, "temperature": 0, **body})


def test_a_live_value_change_restarts_no_replica(stack: LocalStack, http: httpx.Client) -> None:
    entry = next(a for a in stack.serve_config["applications"] if a["name"] == APP)
    original = dict(entry["deployments"][0]["user_config"])
    two_stops = {"prompt": "hello", "stop": ["x", "y"]}
    assert completion(http, **two_stops).status_code == 200, "two stop strings are within the default limits"
    decode = DecodeEngine(stack)
    replicas = stack.serve_replica_ids()
    mine = {r.split("#")[1].split(":")[0] for r in replicas if r.startswith(f"SERVE_REPLICA::{APP}#")}
    assert {"Prefill", "Decode"} <= mine, replicas  # and the frontend deployment, where the app has one
    try:
        stack.apply_live(APP, {"limits": {**original["limits"], "max_stop": 1}, "remote_prefill_min_tokens": 100000})

        def refused() -> bool:
            r = completion(http, **two_stops)
            assert r.status_code in (200, 400), r.text
            return r.status_code == 400 and "stop" in r.json()["error"]["message"]

        wait_until("the frontend to refuse two stop strings (limits.max_stop 1)", refused, timeout_s=60, every_s=1)
        # decode: a prompt far over the old threshold is now under the new one, so decode prefills it itself
        before = decode.settled()
        assert completion(http, prompt=long_prompt(200)).status_code == 200
        wait_until("decode to count a local request",
                   lambda: decode.value(decode.snapshot(), "ray_rld_requests_total", path="local")
                   > decode.value(before, "ray_rld_requests_total", path="local"))
        after = decode.settled()
        assert decode.value(after, "ray_rld_requests_total", path="remote") == \
            decode.value(before, "ray_rld_requests_total", path="remote"), "the long prompt still went to prefill"
        assert stack.serve_replica_ids() == replicas, "changing live values replaced Serve replicas"
    finally:
        stack.apply_live(APP, original)
    wait_until("the original limits back", lambda: completion(http, **two_stops).status_code == 200, timeout_s=60)
    assert stack.serve_replica_ids() == replicas
