"""One real local stack with `frontend.direct_streaming` on (serve_app/engine/direct.py): loopback Ray, vLLM CPU
engines, the tiny model, deployed by the demo's launcher, in Serve's high-throughput mode (HAProxy) as the
chart deploys it. Two apps, both without a frontend deployment:
  direct at /     : prefill + decode; the decode replica serves HTTP itself (selective disaggregation on)
  agg    at /agg  : one engine serving HTTP itself, admission 1 running + 0 queued (to see 429s cheaply)
Started after tests/serve_app's stack is stopped (package scope), on its own port plan.
"""

from __future__ import annotations

from typing import Iterator

import httpx
import pytest

from devstack.ports import TESTS_DIRECT
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
        yield local


@pytest.fixture(scope="package")
def http(stack: LocalStack) -> Iterator[httpx.Client]:
    with authorized_client(stack, API_KEY) as client:
        yield client
