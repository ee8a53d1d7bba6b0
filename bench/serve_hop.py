"""What one Ray Serve deployment hop costs, with nothing of ours in it: the floor under the separate frontend.

    python -m bench.serve_hop [--rounds 300] [--payload-bytes 6000] [--serve-mode high-throughput|standard]

The chart's default graph puts the OpenAI frontend in a deployment of its own, which calls the engine's
deployment through a DeploymentHandle; `frontend.direct_streaming` runs the frontend inside the engine's
replica instead. The per-hop record (serve_app/telemetry/hops.py) shows the first hop costing ~2-3 ms of a
request's time to first token (bench/results/2026-12-01-h200, -cpu). This bench answers whether that is ours or
Serve's: two bare apps on one local Ray cluster in the chart's Serve mode (HAProxy, direct ingress, gRPC between
deployments: devstack.cluster.HIGH_THROUGHPUT_ENV), behind the same HAProxy:

  one-replica   HTTP -> ingress replica, which streams the first chunk itself
  one-hop       HTTP -> ingress replica -> handle.options(stream=True) -> a second deployment's generator,
                whose first chunk the ingress streams on

Both read the request body (a JSON body of --payload-bytes, a 1k-token prompt's size) and pass the parsed body
on, as the frontend does. Paired rounds, order alternating, one request at a time (bench/paired.py's way), time
to the first body byte. Prints a table: p50/p95 per app and the paired difference (the hop's cost here).
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import time
from typing import Any

from devstack.cluster import HIGH_THROUGHPUT_ENV, LocalRayCluster, NodeSpec
from devstack.ports import BENCH
from loadtests.openai_load.samples import percentile


def _apps() -> dict[str, Any]:
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import StreamingResponse

    @serve.deployment(max_ongoing_requests=100, ray_actor_options={"num_cpus": 0})
    class Leaf:
        async def stream(self, body: dict[str, Any]):
            yield b'data: {"first": %d}\n\n' % len(body.get("prompt", ""))
            yield b"data: [DONE]\n\n"

    @serve.deployment(max_ongoing_requests=100, ray_actor_options={"num_cpus": 0})
    class Ingress:
        def __init__(self, leaf: Any = None):
            self._leaf = leaf

        async def __call__(self, request: Request) -> StreamingResponse:
            body = json.loads(await request.body())
            if self._leaf is None:
                async def own():
                    yield b'data: {"first": %d}\n\n' % len(body.get("prompt", ""))
                    yield b"data: [DONE]\n\n"

                return StreamingResponse(own(), media_type="text/event-stream")
            chunks = self._leaf.options(stream=True).stream.remote(body)
            return StreamingResponse(chunks, media_type="text/event-stream")

    return {"one-replica": Ingress.bind(), "one-hop": Ingress.bind(Leaf.bind())}


def first_byte_ms(conn: http.client.HTTPConnection, path: str, body: bytes) -> float:
    t = time.perf_counter()
    conn.request("POST", path, body=body, headers={"content-type": "application/json"})
    response = conn.getresponse()
    if response.status != 200:
        raise RuntimeError(f"{path}: HTTP {response.status}: {response.read()[:200]!r}")
    response.read(1)
    ms = (time.perf_counter() - t) * 1000
    response.read()
    return ms


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.serve_hop", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=300)
    p.add_argument("--warm", type=int, default=30)
    p.add_argument("--payload-bytes", type=int, default=6000)
    p.add_argument("--serve-mode", choices=["high-throughput", "standard"], default="high-throughput")
    p.add_argument("--cluster-env", action="append", default=[], metavar="KEY=VALUE",
                   help="more environment for every Ray process, e.g. RAY_SERVE_USE_GRPC_BY_DEFAULT=0; repeatable")
    a = p.parse_args(argv)
    env = dict(HIGH_THROUGHPUT_ENV) if a.serve_mode == "high-throughput" else {}
    for kv in a.cluster_env:
        if "=" not in kv:
            p.error(f"--cluster-env {kv!r}: expected KEY=VALUE")
        env.update([kv.split("=", 1)])

    import ray
    from ray import serve

    cluster = LocalRayCluster(role_label_key="bench.rld/role", ports=BENCH, nodes=(NodeSpec("head", num_cpus=2),),
                              extra_env=env)
    cluster.start()
    try:
        ray.init(address=cluster.address, logging_level="WARNING", log_to_driver=False)
        serve.start(http_options={"host": "127.0.0.1", "port": BENCH.http})
        for name, app in _apps().items():
            serve.run(app, name=name, route_prefix=f"/{name}")
        body = json.dumps({"model": "m", "prompt": "x" * a.payload_bytes, "max_tokens": 1, "stream": True}).encode()
        conn = http.client.HTTPConnection("127.0.0.1", BENCH.http, timeout=30)
        names = ("one-replica", "one-hop")
        for _ in range(a.warm):
            for name in names:
                first_byte_ms(conn, f"/{name}", body)
        ms: dict[str, list[float]] = {n: [] for n in names}
        for i in range(a.rounds):
            for name in names if i % 2 == 0 else reversed(names):
                ms[name].append(first_byte_ms(conn, f"/{name}", body))
        diff = [h - o for h, o in zip(ms["one-hop"], ms["one-replica"])]
        print(f"\nRay Serve hop, {a.serve_mode} mode{', ' + ' '.join(a.cluster_env) if a.cluster_env else ''}, "
              f"{a.rounds} paired rounds, {len(body)}-byte body, time to the first body byte:")
        print("| app | p50 ms | p95 ms |\n|---|---:|---:|")
        for name in names:
            print(f"| {name} | {statistics.median(ms[name]):.2f} | {percentile(ms[name], 95):.2f} |")
        print(f"| one-hop - one-replica (paired) | {statistics.median(diff):.2f} | {percentile(diff, 95):.2f} |")
        return 0
    finally:
        ray.shutdown()
        cluster.stop()  # every process of the cluster (HAProxy included), found by the cluster's marker


if __name__ == "__main__":
    sys.exit(main())
