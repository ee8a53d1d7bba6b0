"""One real local stack for this package's tests, stopped before the next suite starts its own (two
stacks at once do not fit a 24 GB machine): loopback Ray (head + prefill + decode nodes), vLLM CPU
engines, the tiny model, deployed by the demo's own launcher (devstack.stack) with two apps:
  disagg at /     : prefill + decode, NIXL KV transfer, selective disaggregation
  agg    at /agg  : one engine serving whole requests (the A/B baseline)
Its port plan (devstack/ports.py) is its own, so the suite can run while a demo is up (memory permitting).
"""

from __future__ import annotations

from typing import Iterator

import httpx
import pytest
from openai import OpenAI

from devstack.ports import TESTS_SERVE_APP
from devstack.stack import LocalStack

from .serve_helpers import authorized_client

API_KEY = "rld-serve-app-tests"  # auth is on, as in the demo (tests/resilience covers auth itself)


@pytest.fixture(scope="package")
def stack() -> Iterator[LocalStack]:
    local = LocalStack(
        apps={"disagg": ("/", "disaggregated"), "agg": ("/agg", "aggregated")},
        ports=TESTS_SERVE_APP,
        api_keys=(API_KEY,),
        # the tests read each request's per-hop record from the stream (x-rld-trace is off by default)
        overrides={"disagg": {"frontend.client_trace": True}, "agg": {"frontend.client_trace": True}},
    )
    with local.running(deploy_timeout_s=900):
        yield local


@pytest.fixture(scope="package")
def disagg(stack: LocalStack) -> OpenAI:
    return OpenAI(base_url=stack.base_url("disagg"), api_key=API_KEY, timeout=180, max_retries=0)


@pytest.fixture(scope="package")
def agg(stack: LocalStack) -> OpenAI:
    return OpenAI(base_url=stack.base_url("agg"), api_key=API_KEY, timeout=180, max_retries=0)


@pytest.fixture(scope="package")
def http(stack: LocalStack) -> Iterator[httpx.Client]:
    with authorized_client(stack, API_KEY) as client:
        yield client
