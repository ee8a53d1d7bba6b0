"""The monitoring suite runs on the stack it shares with tests/serve_app (tests/shared_stack.py), right after
that suite: its app `disagg` is the disaggregated app Prometheus would scrape here."""

from __future__ import annotations

import pytest

from .monitoring_live import Scrape, observe
from devstack.stack import LocalStack


@pytest.fixture(scope="package")
def stack(serve_stack: LocalStack) -> LocalStack:
    return serve_stack


@pytest.fixture(scope="package")
def scrapes(stack: LocalStack) -> list[Scrape]:
    """Scrapes under traffic (engines busy: their gauges exported) and after provoked NIXL failures."""
    return observe(stack)
