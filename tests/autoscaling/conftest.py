"""tests/autoscaling: the unit and chart tests need nothing running; test_e2e_coupled.py asks for `stack`, one real
local stack (loopback Ray, vLLM CPU engines, the tiny model, the demo's launcher) whose disaggregated app runs
`autoscaling.mode: coupled` with each role between 1 and 2 replicas, on its own port plan. The prefill and decode
nodes have 4 CPUs each (devstack.cluster.DEFAULT_NODES): room for a second engine replica per role."""

from __future__ import annotations

from typing import Iterator

import pytest

from devstack.ports import TESTS_AUTOSCALING
from devstack.stack import LocalStack

API_KEY = "rld-autoscaling-tests"
APP = "disagg"
DOWNSCALE_DELAY_S = 20
ROLE = {"enabled": True, "min_replicas": 1, "max_replicas": 2}
# Targets a CPU run crosses on purpose, on counts rather than times (the machine's speed does not move them):
# prefill on its queue, decode on the sequences it runs; the latency targets are set out of the way.
COUPLED = {
    "prefill.autoscaling": ROLE,
    "decode.autoscaling": ROLE,
    "autoscaling": {
        "mode": "coupled",
        "prefill": {"waiting_per_replica": 2, "ttft_s": 60},
        "decode": {"running_per_replica": 4, "waiting_per_replica": 8, "itl_s": 10, "kv_cache_usage": 0.9},
        "downscale_delay_s": DOWNSCALE_DELAY_S,
        "look_back_period_s": 12,
        "log_every_s": 5,
    },
}


@pytest.fixture(scope="package")
def stack() -> Iterator[LocalStack]:
    import ray

    local = LocalStack(
        apps={APP: ("/", "disaggregated")},
        ports=TESTS_AUTOSCALING,
        api_keys=(API_KEY,),
        overrides={APP: COUPLED},
        # replicas report their signals every 2 s (Ray's default 10 s would make every phase minutes longer)
        cluster_env={"RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S": "2"},
    )
    with local.running(deploy_timeout_s=900):
        ray.init(address=local.cluster.address, logging_level="WARNING", log_to_driver=False)
        try:
            yield local
        finally:
            ray.shutdown()
