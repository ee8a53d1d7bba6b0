"""Delete the decode pod, then the prefill pod: KubeRay recreates it, Serve brings the engine back on the new
pod, requests are answered again. Meanwhile clients get answers, never a hang: 200, or 503 with Retry-After
(the app's role-unavailable answer). The recovery times are recorded in the suite's timings."""

from __future__ import annotations

import time

import httpx
import pytest

from .conftest import Node, record, wait_until
from .test_serving import decode_kv

ORDER = 1  # after the tests that expect the release as `up` left it
RECOVERY_TIMEOUT_S = 900
CLIENT_TIMEOUT_S = 60  # a request that takes longer than this counts as a hang


def wait_kv_moved(node: Node, before) -> bool:
    try:
        return bool(wait_until(lambda: (lambda a: a.external_tokens > before.external_tokens or a.bytes > before.bytes)(decode_kv(node)),
                               15, "decode's external-KV counters to rise"))
    except AssertionError:
        return False


def one_request(node: Node) -> tuple[int | str, dict]:
    try:
        r = httpx.post(f"{node.base_url}/chat/completions", timeout=CLIENT_TIMEOUT_S,
                       headers={"Authorization": f"Bearer {node.api_key}"},
                       json={"model": "tiny", "messages": [{"role": "user", "content": "hi " * 40}], "max_tokens": 4})
        return r.status_code, dict(r.headers)
    except httpx.TimeoutException:
        return "timeout", {}
    except httpx.TransportError as e:
        return type(e).__name__, {}


@pytest.mark.parametrize("role", ["decode", "prefill"])
def test_a_deleted_engine_pod_comes_back_and_clients_never_hang(node: Node, role: str) -> None:
    assert one_request(node)[0] == 200
    old = node.ray_pods()[role][0]["metadata"]["name"]
    t0 = time.monotonic()
    node.kubectl("delete", "pod", "-n", node.namespace, old, "--wait=false")
    seen: list[tuple[float, int | str, str]] = []

    def answered_again() -> bool:
        pods = node.ray_pods().get(role, [])
        kv = decode_kv(node) if role == "prefill" and pods else None
        status, headers = one_request(node)
        seen.append((round(time.monotonic() - t0, 1), status, headers.get("retry-after", "")))
        new = [p for p in pods if p["metadata"]["name"] != old and p["status"].get("phase") == "Running"]
        if not (new and status == 200 and time.monotonic() - t0 > 5):
            return False
        # prefill: decode answers alone meanwhile (local fallback); back means KV moves from prefill again
        return role == "decode" or wait_kv_moved(node, kv)

    wait_until(answered_again, RECOVERY_TIMEOUT_S, f"requests answered again after deleting the {role} pod", interval=3)
    took = time.monotonic() - t0
    record(f"{role} pod deleted -> answered again", took)
    not_ok = [e for e in seen if e[1] != 200]
    record(f"  {role}: requests not answered 200 (of {len(seen)}; statuses {sorted({str(e[1]) for e in not_ok})})",
           float(len(not_ok)))
    statuses = sorted({str(s) for _, s, _ in seen})
    print(f"{role}: back after {took:.0f}s; clients got {statuses}; timeline {seen[:5]} ... {seen[-3:]}")
    hangs = [e for e in seen if e[1] == "timeout"]
    assert not hangs, f"requests hung for {CLIENT_TIMEOUT_S}s while the {role} pod was gone: {hangs}"
    for at, status, retry_after in seen:
        assert status in (200, 503), f"at {at}s a client got {status} (expected 200 or 503 + Retry-After)"
        if status == 503:
            assert retry_after.isdigit(), f"a 503 at {at}s without Retry-After"
