"""Helpers of tests/resilience: streaming requests with timings, metrics scrapes, the processes of a role."""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import httpx
import psutil

from devstack.ports import TESTS_RESILIENCE
from devstack.serve_config import MODEL_ID
from devstack.stack import LocalStack
from tests.serve_app.serve_helpers import Series, scrape, settled, total, wait_until  # noqa: F401 - re-exported

# This suite's port plan (devstack/ports.py); the external endpoint takes its first auxiliary port.
TEST_PORTS = TESTS_RESILIENCE
EXTERNAL_PORT = TEST_PORTS.aux(0)
API_KEYS = ("rld-resilience-key-one", "rld-resilience-key-two")
EXTERNAL_MODEL = "tiny-external"
EXTERNAL_KEY = "rld-resilience-external-key"

# main app: small limits so the admission/overflow tests can saturate it with a handful of requests,
# while the fault tests' load (about one request a second) never queues.
MAIN_ADMISSION = {"max_in_flight": 8, "max_queued": 4, "max_queue_wait_s": 120, "retry_after_s": 3}
MAIN_OVERFLOW_CAP = 2
PREFILL_TIMEOUT_S = 5.0
ROUTING_TIMEOUT_S = 2.0
MAX_TOKENS_CAP = 1024
BODY_READ_TIMEOUT_S = 3.0  # limits.body_read_timeout_s of the main app (default 30): the trickled-body test waits it

# What the suite measured (fuzz counts, fault runs' worst TTFTs, the 401 body), printed at the end of the
# run in a "resilience measurements" section (conftest.pytest_terminal_summary), also when it passes.
MEASUREMENTS: list[str] = []


def measured(line: str) -> None:
    """Print `line` now and repeat it in the end-of-run summary."""
    print(line)
    MEASUREMENTS.append(line.strip().splitlines()[0])


WORDS = "the quick brown fox jumps over lazy dog model token cache request server hello world".split()


def long_prompt(words: int = 300) -> str:
    """A fresh prompt (no prefix-cache hit) well over remote_prefill_min_tokens: the remote path."""
    rng = random.Random(uuid.uuid4().int)
    return " ".join(rng.choice(WORDS) for _ in range(words))


@dataclass
class Outcome:
    """One streamed request as the client saw it."""

    started: float
    status: Optional[int] = None
    ttft_s: Optional[float] = None
    total_s: Optional[float] = None
    backend: Optional[str] = None
    events: list[str] = field(default_factory=list)
    error: Optional[str] = None

    @property
    def ok(self) -> bool:
        """200, at least one token, [DONE] last and no error event."""
        return (
            self.status == 200
            and self.error is None
            and bool(self.events)
            and self.events[-1] == "[DONE]"
            and not self.error_event
        )

    @property
    def error_event(self) -> bool:
        return any('"error"' in e for e in self.events)

    def describe(self) -> str:
        ttft = f"{self.ttft_s:.2f}" if self.ttft_s is not None else "-"
        return (
            f"status={self.status} ttft={ttft}s total={self.total_s:.2f}s backend={self.backend} "
            f"error_event={self.error_event} error={self.error} last={self.events[-1:]}"
        )


def stream_chat(
    client: httpx.Client,
    path: str = "/v1/chat/completions",
    *,
    prompt: Optional[str] = None,
    max_tokens: int = 8,
    headers: Optional[dict[str, str]] = None,
    extra: Optional[dict[str, Any]] = None,
    timeout_s: float = 180,
) -> Outcome:
    """POST a streaming chat request and read it to the end, timing the first token."""
    body = {
        "model": MODEL_ID,
        "messages": [{"role": "user", "content": prompt or long_prompt()}],
        "max_tokens": max_tokens,
        "stream": True,
        **(extra or {}),
    }
    outcome = Outcome(started=time.monotonic())
    try:
        with client.stream("POST", path, json=body, headers=headers, timeout=timeout_s) as response:
            outcome.status = response.status_code
            outcome.backend = response.headers.get("x-rld-backend")
            if response.status_code != 200:
                outcome.error = response.read().decode(errors="replace")[:500]
            else:
                for line in response.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if outcome.ttft_s is None and payload != "[DONE]":
                        outcome.ttft_s = time.monotonic() - outcome.started
                    outcome.events.append(payload)
    except httpx.HTTPError as exc:
        outcome.error = f"{type(exc).__name__}: {exc}"
    outcome.total_s = time.monotonic() - outcome.started
    return outcome


class Load:
    """One streaming request every `interval_s` in the background, each in its own thread."""

    def __init__(self, request: Callable[[], Outcome], interval_s: float = 1.0) -> None:
        self._request = request
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.outcomes: list[Outcome] = []
        self._lock = threading.Lock()
        self._driver = threading.Thread(target=self._drive, daemon=True)

    def _one(self) -> None:
        outcome = self._request()
        with self._lock:
            self.outcomes.append(outcome)

    def _drive(self) -> None:
        while not self._stop.is_set():
            thread = threading.Thread(target=self._one, daemon=True)
            thread.start()
            self._threads.append(thread)
            self._stop.wait(self._interval_s)

    def __enter__(self) -> "Load":
        self._driver.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._driver.join()
        for thread in self._threads:
            thread.join(timeout=240)


def node_metrics(stack: LocalStack, node: str) -> Series:
    return scrape(stack.cluster.metrics_url(node))


def cluster_metrics(stack: LocalStack) -> Series:
    """Every node's series: a frontend replica (no role label) may be placed on any node."""
    series: Series = {}
    for node in stack.cluster.nodes:
        series.update(node_metrics(stack, node.name))
    return series


def engine_requests(stack: LocalStack) -> float:
    """vLLM's running + waiting requests over every engine of the stack (prefill and decode nodes)."""
    count = 0.0
    for node in ("prefill", "decode"):
        series = node_metrics(stack, node)
        count += total(series, "ray_vllm_num_requests_running") + total(series, "ray_vllm_num_requests_waiting")
    return count


def replica_processes(app: str, deployment: str) -> list[psutil.Process]:
    """The Serve replica actor processes of `deployment` in `app` (e.g. "main", "Prefill:tiny")."""
    title = f"ray::ServeReplica:{app}:{deployment}"
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if " ".join(proc.info["cmdline"] or []).startswith(title):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def engine_core(replica: psutil.Process) -> psutil.Process:
    """The vLLM EngineCore process under a replica (the process that schedules and runs the model)."""
    for child in replica.children(recursive=True):
        try:
            if "EngineCore" in " ".join(child.cmdline()):
                return child
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    raise AssertionError(f"no VLLM::EngineCore process under replica pid {replica.pid}")


def running_replicas(app: str, deployment: str) -> int:
    """RUNNING replicas of a deployment, as Serve's controller reports them (needs ray.init)."""
    from ray import serve

    status = serve.status().applications.get(app)
    if status is None or deployment not in status.deployments:
        return 0
    states = status.deployments[deployment].replica_states
    return sum(n for s, n in states.items() if str(getattr(s, "value", s)) == "RUNNING")


def error_of(response: httpx.Response) -> dict[str, Any]:
    """The OpenAI error object of a response (asserting the body has that shape)."""
    body = json.loads(response.content)
    assert set(body) >= {"error"}, body
    error = body["error"]
    assert isinstance(error.get("message"), str) and error["message"], body
    assert {"type", "param", "code"} <= set(error), body
    return error
