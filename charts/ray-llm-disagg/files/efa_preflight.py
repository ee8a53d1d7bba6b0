"""EFA/NIXL preflight, run by `helm test` (tests.efaPreflight.enabled) in a pod next to a decode pod.

Fails (exit 1) when a canary request moved no KV cache from prefill to decode, when a KV transfer
failed, or when NIXL moved the KV but the node's EFA devices did not carry it (NIXL came up without
LIBFABRIC, e.g. on UCX over TCP). Passes (exit 0) when the decode pod next to it received KV over NIXL
and the node's EFA byte counters grew by at least `--min-efa-fraction` of the bytes NIXL reports.

Signals, read before and after each canary request:
  decode pod metrics (Ray's metrics agent; vLLM's names with ':' -> '_' and Ray's `ray_` prefix)
    vllm:nixl_bytes_transferred (histogram _sum/_count)  bytes and transfers NIXL moved
    vllm:nixl_num_failed_transfers                       failed transfers
    vllm:prompt_tokens_by_source{source=external_kv_transfer}  prompt tokens decode got from prefill
  node EFA counters: /sys/class/infiniband/*/ports/*/hw_counters/*_bytes (EFA devices are rdmap*)

Standard library only (it runs on the chart's runtime image). The Kubernetes API (list the release's
decode pods, to find the one on this node) is called with the pod's ServiceAccount token.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import ssl
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

SAMPLE_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eE]+|NaN|[-+]Inf)")
LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def canonical(name: str) -> str:
    """vllm:nixl_bytes_transferred_sum and ray_vllm_nixl_bytes_transferred_sum -> vllm_nixl_bytes_transferred_sum."""
    name = name.replace(":", "_")
    return name[4:] if name.startswith("ray_vllm_") else name


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Prometheus text format -> [(canonical name, labels, value)]."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE_RE.match(line)
        if not m:
            continue
        labels = dict(LABEL_RE.findall(m.group(2) or ""))
        out.append((canonical(m.group(1)), labels, float(m.group(3))))
    return out


@dataclass
class KV:
    """KV-transfer counters of one decode pod (summed over its engines)."""

    bytes: float = 0.0
    transfers: float = 0.0
    failed: float = 0.0
    external_tokens: float = 0.0
    seen: bool = False  # the pod exports NIXL metrics at all

    @classmethod
    def from_metrics(cls, text: str) -> "KV":
        kv = cls()
        for name, labels, value in parse_metrics(text):
            if name == "vllm_nixl_bytes_transferred_sum":
                kv.bytes += value
                kv.seen = True
            elif name == "vllm_nixl_bytes_transferred_count":
                kv.transfers += value
            elif name in ("vllm_nixl_num_failed_transfers_total", "vllm_nixl_num_failed_transfers"):
                kv.failed += value
            elif name in ("vllm_prompt_tokens_by_source_total", "vllm_prompt_tokens_by_source") \
                    and labels.get("source") == "external_kv_transfer":
                kv.external_tokens += value
        return kv

    def minus(self, before: "KV") -> "KV":
        return KV(self.bytes - before.bytes, self.transfers - before.transfers, self.failed - before.failed,
                  self.external_tokens - before.external_tokens, self.seen)


def efa_bytes(sysfs: Path) -> tuple[int, list[str]]:
    """Sum of every *_bytes hardware counter of the node's EFA devices, and the devices seen."""
    total, devices = 0, []
    root = sysfs / "class" / "infiniband"
    for dev in sorted(root.glob("*")) if root.is_dir() else []:
        counters = list(dev.glob("ports/*/hw_counters/*_bytes"))
        if not counters:
            continue
        devices.append(dev.name)
        for c in counters:
            try:
                total += int(c.read_text().strip() or 0)
            except (OSError, ValueError):
                pass
    return total, devices


@dataclass
class Verdict:
    ok: bool
    reasons: list[str] = field(default_factory=list)


def judge(kv: KV, efa_delta: int, devices: list[str], min_fraction: float) -> Verdict:
    """The preflight's decision for one canary that reached the local decode pod (kv = after - before)."""
    reasons = []
    if kv.failed > 0:
        reasons.append(f"{kv.failed:.0f} NIXL KV transfer(s) failed during the canary (vllm:nixl_num_failed_transfers)")
    if kv.bytes <= 0 or kv.transfers <= 0 or kv.external_tokens <= 0:
        reasons.append(
            "the canary request moved no KV: decode's vllm:nixl_bytes_transferred grew by "
            f"{kv.bytes:.0f} B in {kv.transfers:.0f} transfer(s) and its prompt_tokens_by_source"
            f"{{source=external_kv_transfer}} by {kv.external_tokens:.0f} (decode prefilled locally, or NIXL is down)")
    if not devices:
        reasons.append("no EFA device counters under /sys/class/infiniband on this node (EFA not attached?)")
    elif kv.bytes > 0 and efa_delta < min_fraction * kv.bytes:
        reasons.append(
            f"NIXL moved {kv.bytes:.0f} B but the node's EFA devices ({', '.join(devices)}) carried only "
            f"{efa_delta} B (< {min_fraction:.0%}): NIXL came up without LIBFABRIC (e.g. UCX over TCP). "
            "Check kvTransfer.backend, FI_PROVIDER=efa and the decode logs for 'Backend LIBFABRIC was instantiated'")
    return Verdict(not reasons, reasons)


# ------------------------------------------------------------------------------------------------
# I/O: HTTP, Kubernetes API
# ------------------------------------------------------------------------------------------------

def http_get(url: str, timeout: float = 10, headers: dict | None = None, context=None) -> str:
    req = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(req, timeout=timeout, context=context) as r:
        return r.read().decode()


def canary(url: str, model: str, prompt_tokens: int, api_key: str | None, timeout: float) -> None:
    """One completion whose prompt is long enough to go to prefill, one output token."""
    body = json.dumps({"model": model, "prompt": "hello " * prompt_tokens, "max_tokens": 1}).encode()
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    req = urllib.request.Request(url.rstrip("/") + "/v1/completions", data=body, headers=headers)
    with urllib.request.urlopen(req, timeout=timeout) as r:
        r.read()


def local_decode_pods(namespace: str, selector: str, node: str) -> list[str]:
    """IPs of the release's decode pods on this node, from the Kubernetes API."""
    sa = Path("/var/run/secrets/kubernetes.io/serviceaccount")
    token = (sa / "token").read_text().strip()
    ctx = ssl.create_default_context(cafile=str(sa / "ca.crt"))
    host = os.environ.get("KUBERNETES_SERVICE_HOST", "kubernetes.default.svc")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    url = (f"https://{host}:{port}/api/v1/namespaces/{namespace}/pods?labelSelector="
           + urllib.request.quote(selector) + "&fieldSelector=" + urllib.request.quote(f"spec.nodeName={node}"))
    pods = json.loads(http_get(url, headers={"Authorization": f"Bearer {token}"}, context=ctx))["items"]
    return [p["status"]["podIP"] for p in pods if p.get("status", {}).get("podIP")]


def run(args, fetch: Callable[[str], str], send: Callable[[], None], sysfs: Path, pods: Iterable[str],
        log=print, sleep=time.sleep) -> Verdict:
    pods = list(pods)
    if not pods:
        return Verdict(False, ["no decode pod of this release runs on this node (the preflight pod needs one next to it)"])
    urls = [f"http://{ip}:{args.metrics_port}/metrics" for ip in pods]

    def kv_now() -> KV:
        total = KV()
        for u in urls:
            k = KV.from_metrics(fetch(u))
            total = KV(total.bytes + k.bytes, total.transfers + k.transfers, total.failed + k.failed,
                       total.external_tokens + k.external_tokens, total.seen or k.seen)
        return total

    last: Verdict = Verdict(False, ["no canary request sent"])
    for i in range(1, args.canary_requests + 1):
        kv0, (efa0, devices) = kv_now(), efa_bytes(sysfs)
        send()
        sleep(args.settle_seconds)  # metrics are exported every few seconds
        kv1, (efa1, devices) = kv_now(), efa_bytes(sysfs)
        kv = kv1.minus(kv0)
        log(f"canary {i}: local decode KV +{kv.bytes:.0f} B in +{kv.transfers:.0f} transfer(s), "
            f"+{kv.external_tokens:.0f} external prompt tokens, +{kv.failed:.0f} failed; EFA +{efa1 - efa0} B")
        last = judge(kv, efa1 - efa0, devices, args.min_efa_fraction)
        if last.ok or kv.bytes > 0 or kv.failed > 0:
            return last  # the canary reached this node's decode pod: that is the verdict
    return last


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True, help="the serve Service, e.g. http://llm-serve-svc.ns.svc:8000")
    ap.add_argument("--model", required=True)
    ap.add_argument("--namespace", required=True)
    ap.add_argument("--decode-selector", required=True, help="label selector of the release's decode pods")
    ap.add_argument("--node", default=os.environ.get("NODE_NAME", ""))
    ap.add_argument("--metrics-port", type=int, default=8080)
    ap.add_argument("--canary-requests", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--min-efa-fraction", type=float, default=0.5)
    ap.add_argument("--settle-seconds", type=float, default=12.0)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--api-key-file", default="")
    ap.add_argument("--sysfs", default="/sys")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    api_key = Path(args.api_key_file).read_text().split()[0] if args.api_key_file else None
    deadline = time.monotonic() + args.timeout
    while True:  # wait for the endpoint (helm test may start before the model is up)
        try:
            http_get(args.url.rstrip("/") + "/v1/models", timeout=10,
                     headers={"Authorization": f"Bearer {api_key}"} if api_key else None)
            break
        except (urllib.error.URLError, OSError) as exc:
            if time.monotonic() > deadline:
                print(f"FAIL: {args.url}/v1/models not reachable within {args.timeout:.0f}s: {exc}")
                return 1
            time.sleep(5)
    pods = local_decode_pods(args.namespace, args.decode_selector, args.node)
    print(f"decode pods on node {args.node}: {pods}")
    verdict = run(args, fetch=http_get,
                  send=lambda: canary(args.url, args.model, args.prompt_tokens, api_key, timeout=max(30, deadline - time.monotonic())),
                  sysfs=Path(args.sysfs), pods=pods)
    if verdict.ok:
        print("ok: the canary's KV cache moved from prefill to decode over EFA (NIXL LIBFABRIC)")
        return 0
    for r in verdict.reasons:
        print(f"FAIL: {r}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
