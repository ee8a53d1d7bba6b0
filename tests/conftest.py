"""Rules every suite relies on (see also tests/__init__.py)."""

from __future__ import annotations

import sys
from typing import Iterator

import pytest

from tests.suite_times import SuiteClock


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(SuiteClock(), "rld-suite-times")  # the "suite times" table at the end


def _ray_connected() -> bool:
    ray = sys.modules.get("ray")  # not imported: certainly not connected (and no import cost here)
    return bool(ray is not None and ray.is_initialized())


@pytest.fixture(autouse=True)
def _test_leaves_no_ray_connection() -> Iterator[None]:
    """One pytest process runs every suite, and each suite's LocalStack connects to its own Ray cluster. A
    test that leaves this process connected to Ray (its own `ray.init()`, or a Ray API that starts a local
    Ray on first use, e.g. Ray Serve LLM's builders reading the runtime context) makes every later suite's
    stack fail with "Maybe you called ray.init twice". Fail that test instead, by name. (Connections a
    suite's package fixture holds are made before this runs and closed after, so they do not count.)"""
    before = _ray_connected()
    yield
    if not before and _ray_connected():
        sys.modules["ray"].shutdown()  # so that the suites after this one still run
        pytest.fail("this test left the pytest process connected to Ray (ray.init, or a Ray API that "
                    "auto-initializes); call ray.shutdown() before it ends, or do that work in a subprocess")
