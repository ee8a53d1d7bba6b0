"""One real local stack with `frontend.direct_streaming` on (serve_app/engine/direct.py): loopback Ray, vLLM CPU
engines, the tiny model, deployed by the demo's launcher, in Serve's high-throughput mode (HAProxy) as the
chart deploys it. Two apps, both without a frontend deployment:
  direct at /     : prefill + decode; the decode replica serves HTTP itself (selective disaggregation on)
  agg    at /agg  : one engine serving HTTP itself, admission 1 running + 0 queued (to see 429s cheaply)
Started after tests/serve_app's stack is stopped (package scope), on its own port plan.
"""

from __future__ import annotations

import json
import time
from typing import Iterator

import httpx
import pytest

from devstack.ports import TESTS_DIRECT
from serve_app.telemetry.hops import TRACE_SSE_PREFIX
from devstack.serve_config import MODEL_ID
from devstack.stack import LocalStack

from ..serve_app.serve_helpers import authorized_client

API_KEY = "rld-direct-tests"
# client_trace: the tests read each request's per-hop record from the stream (off by default: issue 18).
DIRECT = {"frontend.direct_streaming": True, "frontend.client_trace": True}


@pytest.fixture(scope="package")
def stack() -> Iterator[LocalStack]:
    local = LocalStack(
        apps={"direct": ("/", "disaggregated"), "agg": ("/agg", "aggregated")},
        ports=TESTS_DIRECT,
        api_keys=(API_KEY,),
        overrides={
            "direct": DIRECT,
            "agg": {**DIRECT, "admission.max_in_flight": 1, "admission.max_queued": 0},
        },
    )
    with local.running(deploy_timeout_s=900):
        wait_remote_prefill(local)
        yield local


TRACE = TRACE_SSE_PREFIX.decode()  # the SSE comment line that carries a request's per-hop record


def wait_remote_prefill(stack: LocalStack, timeout_s: float = 300) -> None:
    """Until decode's NIXL pre-warm (its first KV hand-off with prefill) is done, decode prefills every request
    itself (failover reason `kv_handshake_pending`), and a test that expects a long prompt to be prefilled remotely
    would see `fallback` (it did, once in a run, 2026-12-06). Long prompts, one at a time, until one's per-hop
    record says `remote`."""
    body = {"model": MODEL_ID, "prompt": " ".join(["fox"] * 300), "max_tokens": 1, "stream": True}
    headers = {"Authorization": f"Bearer {API_KEY}", "x-rld-trace": "1"}
    deadline = time.monotonic() + timeout_s
    paths: list[str] = []
    with httpx.Client(base_url=stack.base_url("direct"), headers=headers, timeout=120) as client:
        while time.monotonic() < deadline:
            with client.stream("POST", "/completions", json=body) as r:
                assert r.status_code == 200, r.read()[:300]
                traces = [line for line in r.iter_lines() if line.startswith(TRACE)]
            paths.append(json.loads(traces[0][len(TRACE):])["path"] if traces else "untraced")
            if paths[-1] == "remote":
                return
            time.sleep(2)
    pytest.fail(f"no long prompt was prefilled remotely within {timeout_s:.0f} s (paths seen: {paths})")


@pytest.fixture(scope="package")
def http(stack: LocalStack) -> Iterator[httpx.Client]:
    with authorized_client(stack, API_KEY) as client:
        yield client
