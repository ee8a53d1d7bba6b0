"""The three ways the bench serves the tiny model, each started and stopped as a child process.

- `vllm`: vLLM's own OpenAI server (`python -m vllm.entrypoints.openai.api_server`), with the
  engine arguments and environment of our app's decode engine (devstack.serve_config), so
  the only difference from `aggregated` is the Ray Serve request path.
- `aggregated` / `disaggregated`: our serve app on a local Ray cluster, started by
  `python -m bench.app_server`, which drives the colleague's `devstack.stack.LocalStack`
  with a port plan of its own (it must not collide with a demo or test cluster).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Optional

from serve_app.llm_configs import CPU_WORKER_EXTENSION

REPO_ROOT = Path(__file__).resolve().parents[1]
MODES = ("vllm", "aggregated", "disaggregated")
HOST = "127.0.0.1"


class ServerStartError(RuntimeError):
    pass


def port_in_use(port: int, host: str = HOST) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


# Our app runs with auth on in the bench, as in the demo; vLLM's own server (no --api-key) ignores the header.
BENCH_API_KEY = "rld-bench-key"
AUTH_HEADER = {"Authorization": f"Bearer {BENCH_API_KEY}"}


def _http_ok(url: str, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=AUTH_HEADER), timeout=timeout_s) as r:
            return r.status == 200
    except OSError:
        return False


@dataclass
class ServerProcess:
    """A server child process in its own session (so the whole tree can be signalled)."""

    mode: str
    cmd: list[str]
    env: dict[str, str]
    log_path: Path
    base_url: str  # http://127.0.0.1:PORT/v1
    ready_marker: Optional[bytes] = None  # a log line that must appear first (the app launcher's READY)
    proc: Optional[subprocess.Popen[bytes]] = None
    started_s: float = 0.0
    ready_s: float = 0.0
    _log: Optional[IO[bytes]] = field(default=None, repr=False)

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "wb")
        self.started_s = time.monotonic()
        self.proc = subprocess.Popen(self.cmd, env=self.env, cwd=REPO_ROOT, stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def _marker_seen(self) -> bool:
        if self.ready_marker is None:
            return True
        try:
            return self.ready_marker in self.log_path.read_bytes()
        except OSError:
            return False

    def wait_ready(self, timeout_s: float) -> float:
        """Wait for the ready marker in the log (if any), then for GET /v1/models to answer 200.

        For the app, /v1/models answers as soon as the ingress is up, before the engine replica is;
        the launcher's READY line comes after Serve reports RUNNING and a warm-up request.
        Returns seconds since start; raises with the log tail."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerStartError(f"{self.mode} server exited with {self.proc.returncode} before it was "
                                       f"ready; log {self.log_path}:\n{self.log_tail()}")
            if self._marker_seen() and _http_ok(self.base_url + "/models"):
                self.ready_s = time.monotonic() - self.started_s
                return self.ready_s
            time.sleep(1.0)
        raise ServerStartError(f"{self.mode} server not ready after {timeout_s:.0f} s; log {self.log_path}:\n"
                               f"{self.log_tail()}")

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    @property
    def port(self) -> int:
        return int(self.base_url.rsplit(":", 1)[1].split("/", 1)[0])

    def stop(self, grace_s: float = 60.0) -> None:
        """SIGTERM the child (the app launcher stops its Ray cluster on SIGTERM), then SIGKILL its
        process group if anything is left after `grace_s`."""
        p = self.proc
        if p is None:
            return
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(p.pid, signal.SIGKILL)  # leftovers of our own session only
        except (ProcessLookupError, PermissionError):
            pass
        if p.poll() is None:
            p.wait(timeout=10)
        if self._log:
            self._log.close()
        self.proc = None
        deadline = time.monotonic() + 30  # the next server wants this port: wait until it is free
        while port_in_use(self.port) and time.monotonic() < deadline:
            time.sleep(0.5)


def _serve_config_module():  # type: ignore[no-untyped-def]
    try:
        from devstack import serve_config
    except ImportError as e:  # pragma: no cover - only when the launcher is missing
        raise ServerStartError(f"devstack (the local launcher) is not importable: {e}") from e
    return serve_config


def vllm_server(port: int, model_path: str, log_path: Path, *, served_name: Optional[str] = None,
                engine_args: Optional[dict[str, Any]] = None, env: Optional[dict[str, str]] = None) -> ServerProcess:
    """vLLM's OpenAI server. Defaults: the same engine settings and environment as the local app's
    decode engine (tiny model on CPU), so it differs from `aggregated` only by the Serve request path.
    The GPU bench passes the engine arguments and environment its app engines get."""
    sc = _serve_config_module()
    if engine_args is None:
        # plus the AMX permission in its worker, as the app's CPU engines get (serve_app/engine/cpu.py)
        engine_args = {**sc.CPU_ENGINE_ARGS, "worker_extension_cls": CPU_WORKER_EXTENSION}
        env = {**sc.CPU_LOOPBACK_ENV, "VLLM_CPU_OMP_THREADS_BIND": sc.CORE_OF_ROLE["decode"], **(env or {})}
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_path,
           "--served-model-name", served_name or sc.MODEL_ID, "--host", HOST, "--port", str(port)]
    cmd += engine_cli_args(engine_args)
    full_env = {**os.environ, "TRANSFORMERS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", **(env or {})}
    return ServerProcess("vllm", cmd, full_env, log_path, f"http://{HOST}:{port}/v1")


def engine_cli_args(engine_args: dict[str, Any]) -> list[str]:
    """vLLM engine keyword arguments as `vllm serve` flags (True -> bare flag, False -> omitted)."""
    args: list[str] = []
    for key, value in engine_args.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            args.append(flag)
        elif value is not False and value is not None:
            args += [flag, json.dumps(value) if isinstance(value, (dict, list)) else str(value)]
    return args


def app_server(mode: str, port: int, log_path: Path, extra_env: Optional[dict[str, str]] = None) -> ServerProcess:
    cmd = [sys.executable, "-m", "bench.app_server", "--mode", mode, "--port", str(port)]
    env = dict(os.environ, **(extra_env or {}))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return ServerProcess(mode, cmd, env, log_path, f"http://{HOST}:{port}/v1",
                         ready_marker=b"bench.app_server: READY")


def tiny_model_path() -> str:
    try:
        from devstack.tiny_model import ensure_tiny_model
    except ImportError as e:
        raise ServerStartError(f"devstack.tiny_model is not importable: {e}") from e
    return str(ensure_tiny_model())
