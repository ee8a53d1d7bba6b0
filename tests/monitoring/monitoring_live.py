"""The real local stack as Prometheus would see it: traffic, provoked NIXL failures, labelled scrapes.

Shared by test_metric_names.py and dashboard_png.py. The stack is the demo's own launcher
(devstack.stack), disaggregated only, on this suite's ports. Each scrape of a node's Ray metrics
port gets the target labels the chart's PodMonitor adds in a cluster (namespace, pod,
app_kubernetes_io_instance, ray_io_group), so the chart's queries can be checked against it as they are.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from typing import Callable, Optional

from prometheus_client.parser import text_string_to_metric_families

from devstack.ports import TESTS_OBSERVABILITY
from devstack.serve_config import MODEL_ID
from devstack.stack import LocalStack

PORTS = TESTS_OBSERVABILITY  # devstack/ports.py: dashboard_png.py's own plan (the suite shares tests/serve_app's stack)
APP = "disagg"
# What the chart's PodMonitor gives every series of a pod (release llm in namespace llm): KubeRay's
# `ray.io/group` of the head is `headgroup`, of a worker its group name.
NAMESPACE = RELEASE = "llm"
RAY_IO_GROUP = {"head": "headgroup", "prefill": "prefill", "decode": "decode"}

WORDS = "the quick brown fox jumps over lazy dog model token cache request server hello world".split()


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


@dataclass(frozen=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float

    def label(self, key: str) -> Optional[str]:
        return dict(self.labels).get(key)


@dataclass
class Scrape:
    """One scrape of every node, at `t` seconds since the first."""

    t: float
    samples: list[Sample]


def new_stack() -> LocalStack:
    """dashboard_png.py's stack (the test suite uses the one it shares with tests/serve_app)."""
    return LocalStack(apps={APP: ("/", "disaggregated")}, ports=PORTS)


def scrape_node(stack: LocalStack, node: str) -> list[Sample]:
    with urllib.request.urlopen(stack.cluster.metrics_url(node), timeout=30) as response:
        text = response.read().decode()
    target = {"namespace": NAMESPACE, "pod": f"{RELEASE}-{node}", "app_kubernetes_io_instance": RELEASE,
              "ray_io_group": RAY_IO_GROUP[node], "job": f"{NAMESPACE}/{RELEASE}", "container": "ray"}
    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            # Prometheus' honor_labels: false (the PodMonitor's default): a label the target also sets is
            # kept as exported_<label> (Ray Serve's long-poll histograms carry their own `namespace`).
            labels = {(f"exported_{k}" if k in target else k): v for k, v in s.labels.items()}
            labels.update(target)
            out.append(Sample(s.name, tuple(sorted(labels.items())), s.value))
    return out


def scrape_all(stack: LocalStack) -> list[Sample]:
    return [s for node in RAY_IO_GROUP for s in scrape_node(stack, node)]


def prompt(words: int) -> str:
    rng = random.Random(uuid.uuid4().int)
    return " ".join(rng.choice(WORDS) for _ in range(words))


def post(stack: LocalStack, path: str, body: dict, timeout_s: float = 180) -> bytes:
    headers = {"Content-Type": "application/json"}
    if stack.api_keys:  # the stack shared with tests/serve_app has auth on
        headers["Authorization"] = f"Bearer {stack.api_keys[0]}"
    request = urllib.request.Request(f"{stack.base_url(APP)}/{path}", data=json.dumps(body).encode(),
                                     headers=headers, method="POST")
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return response.read()


@dataclass
class Traffic:
    """Client threads sending streamed completions: long prompts (remote prefill path) and, every
    `local_every`-th request, a short chat (prefilled locally on decode)."""

    stack: LocalStack
    clients: int = 3
    prompt_words: int = 300
    max_tokens: int = 24
    local_every: int = 4
    sent: int = 0
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def _client(self) -> None:
        while not self._stop.is_set():
            self.sent += 1
            try:
                if self.sent % self.local_every == 0:
                    post(self.stack, "chat/completions", {"model": MODEL_ID, "stream": True, "max_tokens": self.max_tokens,
                                                         "messages": [{"role": "user", "content": "hello"}]})
                else:
                    post(self.stack, "completions", {"model": MODEL_ID, "stream": True, "max_tokens": self.max_tokens,
                                                    "prompt": prompt(self.prompt_words)})
            except Exception as exc:  # noqa: BLE001 - recorded, the test asserts there are none
                self.errors.append(repr(exc))

    def start(self) -> "Traffic":
        self._threads = [threading.Thread(target=self._client, daemon=True) for _ in range(self.clients)]
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=240)


def provoke_nixl_failures(stack: LocalStack) -> None:
    """Two real NIXL failures on the prefill engine, through Serve's own handle to the Prefill deployment
    (a driver on the local cluster; clients cannot send kv_transfer_params):

    1. a prefill exactly as decode asks for it (`do_remote_decode`), whose KV nobody then pulls: the
       engine frees it when vLLM's KV lease (30 s) runs out -> `vllm:nixl_num_kv_expired_reqs`;
    2. a request told to pull its KV from that prefill at a port where nothing listens: the NIXL
       handshake fails -> `vllm:nixl_num_failed_transfers` (the engine then recomputes the prompt:
       kv_transfer.load_failure_policy recompute);
    3. a prompt longer than the context, sent past the frontend's validation: the engine answers with
       an error -> `ray_rld_request_errors_total` of the prefill role.
    """
    import ray
    from ray import serve
    from serve_app.upstream import CompletionRequest

    async def run() -> None:
        handle = serve.get_deployment_handle(f"Prefill:{MODEL_ID}", app_name=APP).options(stream=True)
        text = prompt(200)
        first = CompletionRequest(model=MODEL_ID, prompt=text, max_tokens=1, stream=False, kv_transfer_params={
            "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
            "remote_block_ids": None, "remote_host": None, "remote_port": None})
        chunks = [c async for c in handle.completions.remote(first, None)]
        params = chunks[0].kv_transfer_params
        assert params and params.get("remote_block_ids"), f"prefill returned no kv_transfer_params: {chunks[0]}"
        # a port of this suite's own plan that nothing listens on (aux ports serve no one here)
        unreachable = dict(params, remote_port=stack.ports.aux(9), remote_engine_id=f"gone-{uuid.uuid4().hex[:8]}")
        second = CompletionRequest(model=MODEL_ID, prompt=text, max_tokens=2, stream=False, kv_transfer_params=unreachable)
        try:
            [c async for c in handle.completions.remote(second, None)]
        except Exception as exc:  # noqa: BLE001 - a failed KV load may also end the request
            log(f"pull from an unreachable peer ended: {type(exc).__name__}")
        too_long = CompletionRequest(model=MODEL_ID, prompt=prompt(3000), max_tokens=1, stream=False)
        try:
            answer = [c async for c in handle.completions.remote(too_long, None)]
            log(f"a prompt over the context answered: {str(answer[0])[:200]}")
        except Exception as exc:  # noqa: BLE001 - an error answer is the point
            log(f"a prompt over the context ended as expected: {type(exc).__name__}")

    ray.init(address=stack.cluster.address, logging_level="WARNING", log_to_driver=False)
    try:
        asyncio.run(run())
    finally:
        ray.shutdown()


def wait_for(what: str, check: Callable[[], bool], timeout_s: float, every_s: float = 3) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def names(samples: list[Sample]) -> set[str]:
    return {s.name for s in samples}


def observe(stack: LocalStack, *, busy_s: float = 40, every_s: float = 2, clients: int = 3,
            with_failures: bool = True) -> list[Scrape]:
    """Scrapes every `every_s` while traffic flows for `busy_s`, then after the provoked failures."""
    scrapes: list[Scrape] = []
    t0 = time.monotonic()
    traffic = Traffic(stack, clients=clients).start()
    try:
        while time.monotonic() - t0 < busy_s:
            scrapes.append(Scrape(time.monotonic() - t0, scrape_all(stack)))
            time.sleep(every_s)
    finally:
        traffic.stop()
    assert not traffic.errors, f"requests failed under test traffic: {traffic.errors[:3]}"
    log(f"traffic: {traffic.sent} requests in {busy_s:.0f} s, {len(scrapes)} scrapes")
    if with_failures:
        provoke_nixl_failures(stack)
        want = {"ray_vllm_nixl_num_failed_transfers_total", "ray_vllm_nixl_num_kv_expired_reqs_total",
                "ray_rld_request_errors_total"}

        def failures_exported() -> bool:
            scrapes.append(Scrape(time.monotonic() - t0, scrape_all(stack)))
            return want <= names(scrapes[-1].samples)

        wait_for(f"{sorted(want)} in the scrape (the KV lease is 30 s)", failures_exported, timeout_s=120)
    return scrapes
