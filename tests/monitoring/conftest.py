"""One real local stack for the monitoring suite (disaggregated, tiny CPU model, its own port plan),
stopped before the next suite starts its own (two stacks at once do not fit a 24 GB machine).

Starting it takes ~2-4 min and ~9 GB; run under `flock /tmp/rld-stack.lock` on a shared machine.
"""

from __future__ import annotations

from typing import Iterator

import pytest

from .monitoring_live import Scrape, observe, new_stack
from devstack.stack import LocalStack


@pytest.fixture(scope="package")
def stack() -> Iterator[LocalStack]:
    with new_stack().running(deploy_timeout_s=900) as local:
        yield local


@pytest.fixture(scope="package")
def scrapes(stack: LocalStack) -> list[Scrape]:
    """Scrapes under traffic (engines busy: their gauges exported) and after provoked NIXL failures."""
    return observe(stack)
