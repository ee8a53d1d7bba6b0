"""Fixtures for the load-test suite: a real OpenAI server on loopback and a Locust runner.

`llm_server` (module scope) serves the tiny model with OUR app, aggregated mode: the `agg` app of the stack
tests/serve_app and tests/monitoring share (tests/shared_stack.py; this suite runs right before them, so
one stack start serves all three). Set RLD_LOADTEST_SERVER=vllm to use vLLM's own OpenAI server instead (also
the fallback when the launcher is not importable), or RLD_LOADTEST_URL=http://127.0.0.1:PORT to
use a server that is already running. Whatever serves, it is started and stopped here.
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

import pytest
from .lt_helpers import Server

from devstack.ports import TESTS_LOADTESTS
from serve_app.llm_configs import CPU_WORKER_EXTENSION
from tests.shared_stack import FIXTURE

# The suite's own port plan (devstack/ports.py): disjoint from the demo's, the bench's and the other suites'.
TEST_VLLM_PORT = TESTS_LOADTESTS.aux(0)


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/models", timeout=3) as r:
            return r.status == 200
    except OSError:
        return False


def _start_vllm(log_path: Path) -> tuple[Server, subprocess.Popen[bytes]]:
    from devstack.tiny_model import ensure_tiny_model

    model = str(ensure_tiny_model())
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1",
               VLLM_CPU_OMP_THREADS_BIND="1")
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
           "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(TEST_VLLM_PORT),
           "--max-model-len", "2048", "--enforce-eager", "--dtype", "bfloat16",
           "--worker-extension-cls", CPU_WORKER_EXTENSION]  # AMX permission in its worker, as the app's engines
    log = open(log_path, "wb")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{TEST_VLLM_PORT}/v1"
    deadline = time.monotonic() + 300
    while not _ready(url):
        if proc.poll() is not None or time.monotonic() > deadline:
            _stop_vllm(proc)
            tail = log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"vLLM server did not become ready (exit {proc.returncode}):\n{tail}")
        time.sleep(1)
    return Server(url, "vllm"), proc


def _stop_vllm(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@pytest.fixture(scope="module")  # only test_loadtest_e2e.py uses it: stopped before other suites start theirs
def llm_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    external = os.environ.get("RLD_LOADTEST_URL")
    if external:
        url = external.rstrip("/")
        url = url if url.endswith("/v1") else url + "/v1"
        assert _ready(url), f"RLD_LOADTEST_URL={external}: GET /v1/models did not answer 200"
        yield Server(url, "external", api_key=os.environ.get("OPENAI_API_KEY"))
        return
    want = os.environ.get("RLD_LOADTEST_SERVER", "app")
    if want == "app":
        try:
            import devstack.stack  # noqa: F401
        except ImportError as e:
            print(f"\n[loadtests] launcher not importable ({e}); using vLLM's own server", file=sys.stderr)
            want = "vllm"
    t0 = time.monotonic()
    if want == "app":
        from tests.shared_stack import API_KEY

        stack = request.getfixturevalue(FIXTURE)  # started here when this suite runs first; stopped by its last user
        server = Server(stack.base_url("agg"), "app-aggregated", api_key=API_KEY)
        print(f"\n[loadtests] our app (aggregated) at {server.base_url}, up in {time.monotonic() - t0:.0f} s",
              file=sys.stderr)
        yield server
    else:
        server, proc = _start_vllm(tmp_path_factory.mktemp("vllm") / "vllm.log")
        print(f"\n[loadtests] vLLM OpenAI server at {server.base_url}, up in {time.monotonic() - t0:.0f} s",
              file=sys.stderr)
        try:
            yield server
        finally:
            _stop_vllm(proc)
