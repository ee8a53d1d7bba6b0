"""serve_app.engine.nixl: vLLM's NIXL connectors with NIXL's busy UCX progress thread off (no Ray, no engine)."""

from __future__ import annotations

import importlib
import resource
import time

import pytest

from serve_app.llm_configs import NIXL_CONNECTOR_MODULE


def test_the_module_vllm_loads_exports_vllms_own_connectors_under_their_names() -> None:
    from serve_app.upstream import nixl_connector_module as connector

    module = importlib.import_module(NIXL_CONNECTOR_MODULE)
    assert module.NixlConnector is connector.NixlConnector
    assert module.NixlPushConnector is connector.NixlPushConnector


def test_ucx_only_agents_get_no_progress_thread_other_backends_keep_it() -> None:
    importlib.import_module(NIXL_CONNECTOR_MODULE)
    from serve_app.upstream import nixl_base_worker as base_worker

    ucx = base_worker.nixl_agent_config(num_threads=4, capture_telemetry=True)  # vLLM's UCX-only call
    efa = base_worker.nixl_agent_config(backends=["LIBFABRIC"], capture_telemetry=True)
    assert ucx.enable_pthread is False and ucx.num_threads == 4
    assert efa.enable_pthread is True
    importlib.reload(importlib.import_module(NIXL_CONNECTOR_MODULE))  # importing twice does not wrap twice
    assert base_worker.nixl_agent_config(num_threads=1).enable_pthread is False


def _idle_cpu_of_an_agent(tmp_name: str) -> float:
    from serve_app.upstream import nixl_base_worker as base_worker

    agent = base_worker.NixlWrapper(tmp_name, base_worker.nixl_agent_config(num_threads=1))
    before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.monotonic()
    time.sleep(2)
    after = resource.getrusage(resource.RUSAGE_SELF)
    del agent
    used = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return used / (time.monotonic() - started)


@pytest.mark.slow
def test_an_idle_ucx_agent_as_vllm_makes_it_uses_no_cpu() -> None:
    """The reason for the module: with NIXL's own progress thread an idle agent spins (~0.7-0.8 of a core)."""
    importlib.import_module(NIXL_CONNECTOR_MODULE)
    assert _idle_cpu_of_an_agent("rld-unit-idle") < 0.2
