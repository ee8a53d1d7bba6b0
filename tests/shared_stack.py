"""One local stack shared by tests/loadtests (its `agg` app), tests/serve_app and tests/monitoring (`disagg`):
starting a stack costs 2-4 min on 2 cores (issue 22: the suites' own time). tests/conftest.py runs the three
suites back to back (tests/serve_app's last test breaks `agg` on purpose: loadtests go first); the stack starts
for the first test that asks for it (fixture `serve_stack`) and stops right after the last one, before any other
suite starts its own (two stacks do not fit 24 GB).

The stack: loopback Ray (head + prefill + decode nodes), vLLM CPU engines, the tiny model, deployed by the demo's
own launcher (devstack.stack) with two apps, auth on:
  disagg at /     : prefill + decode, NIXL KV transfer, selective disaggregation
  agg    at /agg  : one engine serving whole requests (the A/B baseline)
Its port plan (devstack/ports.py) is its own, so the suites can run while a demo is up (memory permitting).
"""

from __future__ import annotations

import contextlib
from typing import Optional

from devstack.ports import TESTS_SERVE_APP
from devstack.stack import LocalStack

API_KEY = "rld-serve-app-tests"  # auth is on, as in the demo (tests/resilience covers auth itself)
SUITES = ("loadtests", "serve_app", "monitoring")  # the suites that use it, in the order they run
FIXTURE = "serve_stack"


def new_stack() -> LocalStack:
    return LocalStack(
        apps={"disagg": ("/", "disaggregated"), "agg": ("/agg", "aggregated")},
        ports=TESTS_SERVE_APP,
        api_keys=(API_KEY,),
        # tests/serve_app reads each request's per-hop record from the stream (x-rld-trace is off by default)
        overrides={"disagg": {"frontend.client_trace": True}, "agg": {"frontend.client_trace": True}},
    )


class SharedStack:
    """Starts the stack on first `get()`; `stop()` is idempotent."""

    def __init__(self) -> None:
        self._exit: Optional[contextlib.ExitStack] = None
        self._stack: Optional[LocalStack] = None
        self._failed: Optional[BaseException] = None

    @property
    def running(self) -> bool:
        return self._stack is not None

    def get(self) -> LocalStack:
        if self._failed is not None:  # one failed start fails every test that needs it, without retrying
            raise RuntimeError(f"the stack shared by loadtests, serve_app and monitoring failed to start: {self._failed}")
        if self._stack is None:
            exit_stack = contextlib.ExitStack()
            try:
                self._stack = exit_stack.enter_context(new_stack().running(deploy_timeout_s=900))
            except BaseException as exc:
                exit_stack.close()
                self._failed = exc
                raise
            self._exit = exit_stack
        return self._stack

    def stop(self) -> None:
        exit_stack, self._exit, self._stack = self._exit, None, None
        if exit_stack is not None:
            exit_stack.close()


def order_suites(items: list) -> None:
    """Move the items of SUITES next to each other (in place), where the first of them is."""
    def suite(item) -> str:
        parts = item.nodeid.split("/")
        return parts[1] if len(parts) > 2 and parts[0] == "tests" else ""

    shared = [i for i in items if suite(i) in SUITES]
    if not shared:
        return
    first = next(n for n, i in enumerate(items) if suite(i) in SUITES)
    rest = [i for i in items if suite(i) not in SUITES]
    shared.sort(key=lambda i: SUITES.index(suite(i)))  # stable: each suite keeps its own order
    items[:] = rest[:first] + shared + rest[first:]
