"""tests/resilience: the serve path under bad input, overload and faults, against the real app.

One stack for this directory (starting one takes ~3 min; package scope: it is stopped before another
suite starts its own, two stacks do not fit a 24 GB machine), built by the demo's own launcher
(devstack.stack.LocalStack) with auth on (two API keys) and three apps:

  main          /              disaggregated: prefill x1, decode x2 (the decode-kill test needs two),
                               small admission limits, a short prefill deadline, overflow ON (saturation)
  unplaced      /unplaced      both roles pinned to a node label no node has: nothing can be placed;
                               overflow off -> 503 naming the role
  unplaced-ovf  /unplaced-ovf  the same, overflow ON -> the external endpoint serves

All three run the separate frontend deployment (`frontend.direct_streaming: false`, the non-default variant): what
this suite asserts is that deployment's contract (a frontend that answers while no engine of the app can be
placed, overflow while decode is down, a request retried on the other decode replica, admission per frontend
replica). The default graph (the frontend inside the decode replica) has its own stack in tests/direct, which
runs the same hostile requests (tests/resilience/hostile_cases.py) against it.

plus the external OpenAI-compatible endpoint overflow goes to: vLLM's own server on the tiny model, on
127.0.0.1, with an API key of its own (served as "tiny-external", so the model mapping is exercised).

Modules run in a fixed order (see `pytest_collection_modifyitems`): the fault tests last, because they
kill replicas; each fault test waits until every replica is back before it ends.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import httpx
import pytest
from openai import OpenAI
from .resilience_helpers import (
    API_KEYS,
    EXTERNAL_KEY,
    EXTERNAL_MODEL,
    EXTERNAL_PORT,
    MAIN_ADMISSION,
    MAIN_OVERFLOW_CAP,
    MAX_TOKENS_CAP,
    BODY_READ_TIMEOUT_S,
    MEASUREMENTS,
    PREFILL_TIMEOUT_S,
    ROUTING_TIMEOUT_S,
    TEST_PORTS,
)

from devstack.serve_config import MODEL_ID
from serve_app.llm_configs import CPU_WORKER_EXTENSION
from devstack.stack import LocalStack

def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if MEASUREMENTS:
        terminalreporter.section("resilience measurements")
        for line in MEASUREMENTS:
            terminalreporter.write_line(line)


MODULE_ORDER = ("test_auth", "test_requests", "test_overload", "test_roles", "test_faults")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Order this directory's modules (faults last); items of other suites keep their places."""
    here = Path(__file__).parent
    slots = [i for i, item in enumerate(items) if Path(str(item.fspath)).parent == here]

    def rank(item: pytest.Item) -> int:
        name = Path(str(item.fspath)).stem
        return MODULE_ORDER.index(name) if name in MODULE_ORDER else -1  # unit tests first

    ordered = sorted((items[i] for i in slots), key=rank)  # stable within a module
    for slot, item in zip(slots, ordered):
        items[slot] = item


STALL_S = 300


def _cpu_seconds(pid: int) -> float:
    """CPU time of a process and its descendants (vLLM's engine core is a child), 0 when gone."""
    import psutil

    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
        return round(sum(p.cpu_times().user + p.cpu_times().system for p in procs), 1)
    except psutil.Error:
        return 0.0


class ExternalEndpoint:
    """vLLM's own server, started in the background: `wait_ready()` before sending to it (the stack fixture does,
    after starting the stack: the two starts overlap, ~1-2 min off the suite on 2 cores)."""

    def __init__(self, url: str, process: subprocess.Popen[bytes], log: Path) -> None:
        self.url, self.process, self.log = url, process, log
        self.ready = False

    def wait_ready(self) -> None:
        # Progress, not a fixed total: on a busy machine the start is slower but keeps writing its log; it is
        # stuck when neither the log nor the process's CPU time moved for STALL_S.
        progress_at, seen = time.monotonic(), None
        while not self.ready and not _ready(self.url, EXTERNAL_KEY):
            now = (self.log.stat().st_size, _cpu_seconds(self.process.pid))
            if now != seen:
                progress_at, seen = time.monotonic(), now
            if self.process.poll() is not None or time.monotonic() - progress_at > STALL_S:
                raise RuntimeError(
                    f"vLLM's OpenAI server did not become ready (exit {self.process.poll()}; no progress for "
                    f"{time.monotonic() - progress_at:.0f} s):\n" + self.log.read_text(errors="replace")[-3000:]
                )
            time.sleep(2)
        self.ready = True


def _ready(url: str, key: str) -> bool:
    request = urllib.request.Request(url + "/models", headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(request, timeout=3) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.fixture(scope="package")
def external(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExternalEndpoint]:
    """vLLM's own OpenAI server on the tiny model: the overflow target (starting; see ExternalEndpoint)."""
    from devstack.tiny_model import ensure_tiny_model

    log = tmp_path_factory.mktemp("external") / "vllm.log"
    env = dict(
        os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND="0"
    )
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(ensure_tiny_model()),
        "--served-model-name", EXTERNAL_MODEL, "--api-key", EXTERNAL_KEY, "--host", "127.0.0.1",
        "--port", str(EXTERNAL_PORT), "--max-model-len", "2048", "--enforce-eager", "--dtype", "bfloat16",
        "--worker-extension-cls", CPU_WORKER_EXTENSION,  # AMX permission in its worker, as the app's engines
    ]  # fmt: skip
    with open(log, "wb") as out:
        process = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{EXTERNAL_PORT}/v1"
    try:
        yield ExternalEndpoint(url, process, log)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)


@pytest.fixture(scope="package")
def overflow_key_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The external endpoint's key as the apps read it (a mounted Secret in production)."""
    key_file = tmp_path_factory.mktemp("overflow") / "external-key"
    key_file.write_text(EXTERNAL_KEY + "\n")
    return key_file


SEPARATE_FRONTEND = {"frontend.direct_streaming": False}  # see the module's docstring


@pytest.fixture(scope="package")
def stack(external: ExternalEndpoint, overflow_key_file: Path) -> Iterator[LocalStack]:
    overflow = {
        "enabled": True,
        "base_url": external.url,
        "api_key_file": str(overflow_key_file),
        "model_map": {MODEL_ID: EXTERNAL_MODEL},
    }
    nowhere = {"placement.role_label_key": "ray-llm-disagg.io/no-such-pool", **SEPARATE_FRONTEND}
    local = LocalStack(
        apps={
            "main": ("/", "disaggregated"),
            "unplaced": ("/unplaced", "disaggregated"),
            "unplaced-ovf": ("/unplaced-ovf", "disaggregated"),
        },
        ports=TEST_PORTS,
        api_keys=API_KEYS,
        overrides={
            "main": {
                **SEPARATE_FRONTEND,
                "decode.replicas": 2,
                "limits.max_tokens": MAX_TOKENS_CAP,
                "limits.body_read_timeout_s": BODY_READ_TIMEOUT_S,
                "admission": MAIN_ADMISSION,
                "failover.prefill_timeout_s": PREFILL_TIMEOUT_S,
                "failover.routing_timeout_s": ROUTING_TIMEOUT_S,
                "timeouts": {"first_token_s": 120, "between_tokens_s": 10},
                "overflow": {**overflow, "max_in_flight": MAIN_OVERFLOW_CAP},
            },
            "unplaced": nowhere,
            "unplaced-ovf": {**nowhere, "overflow": overflow},
        },
        pending_apps=frozenset({"unplaced", "unplaced-ovf"}),
    )
    import ray

    with local.running(deploy_timeout_s=900):
        external.wait_ready()
        ray.init(address=local.cluster.address, logging_level="WARNING", log_to_driver=False)
        try:
            yield local
        finally:
            ray.shutdown()


@pytest.fixture(scope="package")
def http(stack: LocalStack) -> Iterator[httpx.Client]:
    """A client of the whole HTTP port, authenticated with the first key."""
    with httpx.Client(
        base_url=f"http://127.0.0.1:{stack.ports.http}",
        headers={"Authorization": f"Bearer {API_KEYS[0]}"},
        timeout=180,
    ) as client:
        yield client


@pytest.fixture(scope="package")
def anonymous(stack: LocalStack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=f"http://127.0.0.1:{stack.ports.http}", timeout=60) as client:
        yield client


@pytest.fixture(scope="package")
def llm(stack: LocalStack) -> OpenAI:
    return OpenAI(base_url=stack.base_url("main"), api_key=API_KEYS[0], timeout=180, max_retries=0)
