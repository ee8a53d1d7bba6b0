"""`helm upgrade` of a live value (`remotePrefillMinTokens`) under a trickle of requests, on real pods.

The chart README ("Upgrades") says a live value (remotePrefillMinTokens, timeouts, limits) is every Serve
deployment's user_config, applied in place by each replica's `reconfigure`: KubeRay keeps the RayCluster (same
name, same pods), Serve keeps every replica (same actors: no engine restarts), and the new value is in force
(the trickle's ~20-token prompt is now prefilled by decode: its trace says "local"). Every request of the
trickle is answered 200 throughout: zero failed requests. The upgrade's time to the new value is recorded in
the suite's timings table."""

from __future__ import annotations

import threading
import time

import httpx

from .conftest import ROOT, Node, record, wait_until
from .test_recovery import CLIENT_TIMEOUT_S

ORDER = 1.5  # after the pod deletions, before the secure-values release replaces this one

# run in the head pod: the actor ids of Serve's live replicas (an in-place update keeps them all)
NEW_MIN_TOKENS = 64
UPGRADE_TIMEOUT_S = 900


class Trickle:
    """One short streamed request every `every_s` seconds, on a thread; every outcome is kept."""

    def __init__(self, node: Node, every_s: float = 1.0) -> None:
        self.node, self.every_s = node, every_s
        self.seen: list[tuple[float, int | str, str, float]] = []  # (at, status, retry-after, took)
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "Trickle":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(CLIENT_TIMEOUT_S + 10)

    def _run(self) -> None:
        while not self._stop.is_set():
            t = time.monotonic()
            status, retry_after = self.one()
            self.seen.append((round(t - self._t0, 1), status, retry_after, round(time.monotonic() - t, 1)))
            self._stop.wait(self.every_s)

    def one(self) -> tuple[int | str, str]:
        try:
            with httpx.stream("POST", f"{self.node.base_url}/chat/completions", timeout=CLIENT_TIMEOUT_S,
                              headers={"Authorization": f"Bearer {self.node.api_key}"},
                              json={"model": "tiny", "messages": [{"role": "user", "content": "hello"}],
                                    "max_tokens": 4, "stream": True}) as r:
                body = b"".join(r.iter_bytes())
                # a started stream that ends with an error event is a failed request too
                status = r.status_code if not (r.status_code == 200 and b'"error"' in body) else "stream-error"
                return status, r.headers.get("retry-after", "")
        except httpx.TimeoutException:
            return "timeout", ""
        except httpx.TransportError as e:
            return type(e).__name__, ""


def served_locally(node: Node) -> bool:
    """A trickle request took the local path: decode prefilled it itself because its prompt (~20 tokens) is under
    the new threshold (the tiny model tokenizes about one token per character). With `up`'s remotePrefillMinTokens 0 every prompt goes to prefill ("remote"; "fallback" while
    prefill is down), so a "local" trace means the new value is serving. The ingress writes one trace line per
    streamed request (serve/rld_traces_<pid>.log) in whichever Ray pod holds its replica."""
    for pods in node.ray_pods().values():
        for pod in pods:
            container = "ray-head" if pod["metadata"]["labels"]["ray.io/node-type"] == "head" else "ray-worker"
            out = node.kubectl("exec", "-n", node.namespace, pod["metadata"]["name"], "-c", container, "--", "bash", "-c",
                               "cat /tmp/ray/session_latest/logs/serve/rld_traces_*.log 2>/dev/null", check=False)
            if '"path":"local"' in out:
                return True
    return False



def test_a_live_value_upgrade_restarts_nothing_and_fails_no_request(node: Node) -> None:
    clusters = sorted(c["metadata"]["name"] for c in node.get("raycluster", "-n", node.namespace)["items"])
    pods = {g: sorted(p["metadata"]["uid"] for p in ps) for g, ps in node.ray_pods().items()}
    replicas = node.serve_replicas()
    assert replicas, "no Serve replica actors found in the head pod's view of the cluster"
    assert not served_locally(node), "a request was served on the local path before the upgrade (threshold 0)"

    with Trickle(node) as trickle:
        wait_until(lambda: len(trickle.seen) >= 3, 120, "the trickle's first answers")
        assert {s for _, s, _, _ in trickle.seen} == {200}, f"requests failed before the upgrade: {trickle.seen}"
        t0 = time.monotonic()
        node.helm("upgrade", node.release, str(ROOT / "charts" / "ray-llm-disagg"), "-n", node.namespace,
                  "--reuse-values", "--set", f"remotePrefillMinTokens={NEW_MIN_TOKENS}", timeout=300)
        wait_until(lambda: served_locally(node), UPGRADE_TIMEOUT_S,
                   f"a short prompt served on the local path (remotePrefillMinTokens={NEW_MIN_TOKENS} in force)", interval=5)
        mark = len(trickle.seen)
        wait_until(lambda: [s for _, s, _, _ in trickle.seen[mark:]].count(200) >= 3, UPGRADE_TIMEOUT_S,
                   "requests answered 200 again after the upgrade", interval=2)
        took = time.monotonic() - t0
    seen = trickle.seen
    not_ok = [e for e in seen if e[1] != 200]
    record("live-value helm upgrade -> new value serving", took)
    record(f"  upgrade: requests not answered 200 (of {len(seen)})", float(len(not_ok)))
    print(f"upgrade: {len(seen)} requests, {len(not_ok)} not 200: {not_ok[:10]}")

    assert sorted(c["metadata"]["name"] for c in node.get("raycluster", "-n", node.namespace)["items"]) == clusters, \
        "a serve-only upgrade replaced the RayCluster (the chart README promises it in place)"
    assert {g: sorted(p["metadata"]["uid"] for p in ps) for g, ps in node.ray_pods().items()} == pods, \
        "a serve-only upgrade restarted Ray pods"
    assert node.serve_replicas() == replicas, "a live-value upgrade replaced Serve replicas (engines restarted)"
    assert not not_ok, f"{len(not_ok)} of {len(seen)} requests failed during a live-value upgrade: {not_ok[:10]}"

