"""The EFA/NIXL preflight script (charts/ray-llm-disagg/files/efa_preflight.py, run by `helm test` with
tests.efaPreflight.enabled). It can only run on EKS (EFA devices, a real prefill -> decode transfer), so here:
its decisions on metrics text in the exact formats Ray and vLLM export, on a sysfs tree shaped like an EFA
node's, its canary loop, and that the pod the chart renders passes arguments the script accepts."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from .conftest import CHART, render

SCRIPT = CHART / "files" / "efa_preflight.py"
P5 = {"node.kubernetes.io/instance-type": "p5.48xlarge"}
EFA_VALUES = {"efa": {"enabled": True}, "tests": {"efaPreflight": {"enabled": True}},
              "prefill": {"tensorParallelSize": 8, "gpusPerHost": 8, "nodeSelector": P5},
              "decode": {"tensorParallelSize": 8, "gpusPerHost": 8, "nodeSelector": P5}}


@pytest.fixture(scope="module")
def pf():
    spec = importlib.util.spec_from_file_location("efa_preflight", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["efa_preflight"] = mod
    spec.loader.exec_module(mod)
    return mod


def ray_metrics(bytes_=0.0, transfers=0.0, failed=0.0, external=0.0, engines=("0",), prefix="ray_vllm_") -> str:
    """Decode metrics as Ray's metrics agent exports vLLM's (':' -> '_', `ray_` prefix, Ray's own labels)."""
    lines = [f"# HELP {prefix}nixl_bytes_transferred Histogram of bytes transferred per NIXL KV Cache transfers.",
             f"# TYPE {prefix}nixl_bytes_transferred histogram"]
    for e in engines:
        lab = f'Component="core_worker",NodeAddress="10.0.3.17",SessionName="session_x",engine="{e}",model_name="llama"'
        share = 1 / len(engines)
        lines += [f'{prefix}nixl_bytes_transferred_bucket{{{lab},le="2048.0"}} 0.0',
                  f"{prefix}nixl_bytes_transferred_sum{{{lab}}} {bytes_ * share}",
                  f"{prefix}nixl_bytes_transferred_count{{{lab}}} {transfers * share}",
                  f"{prefix}nixl_num_failed_transfers_total{{{lab}}} {failed * share}",
                  f'{prefix}prompt_tokens_by_source_total{{{lab},source="local_compute"}} 7.0',
                  f'{prefix}prompt_tokens_by_source_total{{{lab},source="external_kv_transfer"}} {external * share}']
    return "\n".join(lines) + "\n"


def vllm_metrics(bytes_, transfers, external) -> str:
    """The same from vLLM's own /metrics (names with ':')."""
    return (f'vllm:nixl_bytes_transferred_sum{{engine="0",model_name="m"}} {bytes_}\n'
            f'vllm:nixl_bytes_transferred_count{{engine="0",model_name="m"}} {transfers}\n'
            f'vllm:prompt_tokens_by_source_total{{engine="0",model_name="m",source="external_kv_transfer"}} {external}\n')


def efa_node(root: Path, devices: dict[str, dict[str, int]]) -> Path:
    """/sys/class/infiniband/<dev>/ports/1/hw_counters/<counter> like an EFA node's."""
    for dev, counters in devices.items():
        d = root / "class" / "infiniband" / dev / "ports" / "1" / "hw_counters"
        d.mkdir(parents=True, exist_ok=True)
        for name, value in counters.items():
            (d / name).write_text(f"{value}\n")
    return root


def test_script_uses_only_the_standard_library():
    """It runs with the runtime image's python3, nothing installed."""
    tree = ast.parse(SCRIPT.read_text())
    mods = {n.names[0].name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)}
    mods |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert mods - {"__future__"} <= set(sys.stdlib_module_names), mods


def test_kv_counters_from_ray_and_vllm_formats(pf):
    kv = pf.KV.from_metrics(ray_metrics(bytes_=256 * 2**20, transfers=2, failed=0, external=2048, engines=("0", "1")))
    assert (kv.bytes, kv.transfers, kv.failed, kv.external_tokens, kv.seen) == (256 * 2**20, 2, 0, 2048, True)
    kv = pf.KV.from_metrics(vllm_metrics(1000, 1, 64))
    assert (kv.bytes, kv.transfers, kv.external_tokens) == (1000, 1, 64)
    assert not pf.KV.from_metrics("# nothing\nray_serve_num_http_requests_total 3\n").seen


def test_metric_names_are_the_pinned_vllm_ones():
    """The names the script reads exist in the pinned vLLM (skipped without the project venv)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None:
        pytest.skip("vllm not installed (hack/pyenv.sh)")
    root = Path(spec.origin).parent
    stats = (root / "distributed/kv_transfer/kv_connector/v1/nixl/stats.py").read_text()
    loggers = (root / "v1/metrics/loggers.py").read_text()
    for name in ("vllm:nixl_bytes_transferred", "vllm:nixl_num_failed_transfers"):
        assert f'"{name}"' in stats
    assert '"vllm:prompt_tokens_by_source"' in loggers
    assert '"external_kv_transfer"' in (root / "v1/metrics/stats.py").read_text()


def test_efa_counters_summed_over_devices(pf, tmp_path):
    root = efa_node(tmp_path, {"rdmap16s27": {"rdma_read_bytes": 100, "tx_bytes": 5, "rx_pkts": 999},
                               "rdmap32s27": {"rdma_write_bytes": 40}})
    assert pf.efa_bytes(root) == (145, ["rdmap16s27", "rdmap32s27"])
    assert pf.efa_bytes(tmp_path / "nowhere") == (0, [])


def test_judge(pf):
    moved = pf.KV(bytes=128 * 2**20, transfers=1, external_tokens=1024, seen=True)
    assert pf.judge(moved, 130 * 2**20, ["rdmap0"], 0.5).ok
    v = pf.judge(pf.KV(seen=True), 0, ["rdmap0"], 0.5)
    assert not v.ok and "moved no KV" in v.reasons[0]
    v = pf.judge(pf.KV(bytes=10, transfers=1, failed=1, external_tokens=5), 10, ["rdmap0"], 0.5)
    assert not v.ok and "failed" in v.reasons[0]
    v = pf.judge(moved, 0, [], 0.5)
    assert not v.ok and "no EFA device counters" in " ".join(v.reasons)
    v = pf.judge(moved, 3 * 2**20, ["rdmap0"], 0.5)  # KV moved, EFA idle: NIXL on UCX/TCP
    assert not v.ok and "without LIBFABRIC" in " ".join(v.reasons)


class FakeNode:
    """A decode pod's metrics and this node's EFA counters, advanced by each canary request."""

    def __init__(self, tmp_path: Path, hits: list[bool], over_efa: bool):
        self.sysfs, self.hits, self.over_efa = tmp_path, list(hits), over_efa
        self.kv, self.efa, self.sent = 0.0, 0, 0
        self._write()

    def _write(self):
        efa_node(self.sysfs, {"rdmap16s27": {"rdma_read_bytes": self.efa}})

    def fetch(self, url: str) -> str:
        assert url == "http://10.0.3.17:8080/metrics"
        n = self.kv / (64 * 2**20)
        return ray_metrics(bytes_=self.kv, transfers=n, external=512 * n)

    def send(self):
        self.sent += 1
        if self.hits.pop(0):  # this canary was served by the decode pod on this node
            self.kv += 64 * 2**20
            if self.over_efa:
                self.efa += 64 * 2**20 + 4096
            self._write()


ARGS = SimpleNamespace(metrics_port=8080, canary_requests=4, min_efa_fraction=0.5, settle_seconds=0)


def test_run_retries_until_a_canary_reaches_this_node(pf, tmp_path):
    node = FakeNode(tmp_path, hits=[False, False, True, True], over_efa=True)
    v = pf.run(ARGS, node.fetch, node.send, node.sysfs, ["10.0.3.17"], log=lambda *_: None, sleep=lambda _: None)
    assert v.ok and node.sent == 3


def test_run_fails_when_nixl_is_not_on_efa(pf, tmp_path):
    node = FakeNode(tmp_path, hits=[True], over_efa=False)
    v = pf.run(ARGS, node.fetch, node.send, node.sysfs, ["10.0.3.17"], log=lambda *_: None, sleep=lambda _: None)
    assert not v.ok and "without LIBFABRIC" in " ".join(v.reasons) and node.sent == 1


def test_run_fails_when_no_canary_moves_kv(pf, tmp_path):
    node = FakeNode(tmp_path, hits=[False] * 4, over_efa=True)
    v = pf.run(ARGS, node.fetch, node.send, node.sysfs, ["10.0.3.17"], log=lambda *_: None, sleep=lambda _: None)
    assert not v.ok and "moved no KV" in v.reasons[0] and node.sent == 4


def test_run_fails_without_a_local_decode_pod(pf, tmp_path):
    v = pf.run(ARGS, lambda u: "", lambda: None, tmp_path, [], log=lambda *_: None)
    assert not v.ok and "no decode pod" in v.reasons[0]


def test_rendered_pod_arguments_parse(pf):
    """The chart's preflight pod passes arguments the script's parser accepts, with the values' numbers."""
    r = render(values={**EFA_VALUES, "remotePrefillMinTokens": 3000, "auth": {"apiKeySecret": {"name": "keys", "key": "k"}}})
    pod = next(d for d in r.docs if d["kind"] == "Pod" and d["metadata"]["name"].endswith("-efa-preflight"))
    c = pod["spec"]["containers"][0]
    assert c["command"] == ["python3", "/preflight/efa_preflight.py"]
    args = pf.parse_args(c["args"])
    assert args.prompt_tokens == 6000, "twice remotePrefillMinTokens: the canary must be sent to prefill"
    assert args.canary_requests == 8 and args.min_efa_fraction == 0.5 and args.metrics_port == 8080
    assert args.api_key_file == "/etc/api-keys/k"
    assert {m["mountPath"] for m in c["volumeMounts"]} == {"/preflight", "/etc/api-keys"}
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


def test_reads_a_real_decode_scrape(pf):
    """A real Ray metrics-agent scrape of a disaggregated GPU run (bench/results/h200x2-2026-11-30, 2x H200,
    NIXL over UCX): the decode node's KV counters are what the preflight reads; the prefill node's are empty."""
    import gzip

    from .conftest import REPO

    text = gzip.decompress((REPO / "bench/results/h200x2-2026-11-30/metrics_disagg.txt.gz").read_bytes()).decode()
    nodes = {}
    for block in text.split("### node ")[1:]:
        name, _, body = block.partition("\n")
        nodes[name.strip()] = body
    decode = pf.KV.from_metrics(nodes["decode"])
    assert decode.seen and decode.transfers == 129 and decode.bytes == 5.083496448e10
    assert decode.external_tokens == 527872 and decode.failed == 0
    assert not pf.KV.from_metrics(nodes["prefill"]).bytes, "prefill sends KV; the transfer metrics are decode's"
    # that run moved its KV over UCX on one host: on an EFA node the preflight would have said so
    v = pf.judge(decode, efa_delta=0, devices=["rdmap16s27"], min_fraction=0.5)
    assert not v.ok and "without LIBFABRIC" in " ".join(v.reasons)
