"""Rules every suite relies on (see also tests/__init__.py)."""

from __future__ import annotations

import sys
from typing import Iterator

import pytest

from tests import shared_stack
from tests.suite_times import SuiteClock

_SHARED = shared_stack.SharedStack()
_LAST_USER: list[str] = []  # node id of the last test that uses the shared stack


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(SuiteClock(), "rld-suite-times")  # the "suite times" table at the end


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    shared_stack.order_suites(items)  # the suites sharing a stack run back to back


def pytest_collection_finish(session: pytest.Session) -> None:
    users = [i.nodeid for i in session.items if shared_stack.FIXTURE in getattr(i, "fixturenames", ())]
    _LAST_USER[:] = users[-1:]


@pytest.fixture(scope="session")
def serve_stack() -> "shared_stack.LocalStack":
    """The stack tests/loadtests, tests/serve_app and tests/monitoring share (tests/shared_stack.py)."""
    return _SHARED.get()


@pytest.hookimpl(trylast=True)  # after the item's own fixtures are torn down
def pytest_runtest_teardown(item: pytest.Item, nextitem: "pytest.Item | None") -> None:
    if _SHARED.running and (nextitem is None or item.nodeid in _LAST_USER):
        _SHARED.stop()


def pytest_sessionfinish() -> None:
    _SHARED.stop()


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
