"""serve_app.pod.drain: the worker pod's preStop. The decisions (which node, when to stop waiting, what to log,
never blocking the deletion) with a fake GCS, a fake /proc and an injected clock; tests/e2e deletes real pods."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from serve_app.pod import drain as d


@dataclass
class Info:
    raylet_socket_name: str
    is_head_node: bool = False
    state: int = 0  # ALIVE
    node_manager_address: str = "10.0.0.2"


class NodeID:
    def __init__(self, h: str) -> None:
        self._h = h

    def hex(self) -> str:
        return self._h


class FakeGcs:
    def __init__(self, nodes: dict[str, Info], accept: bool = True, fail: Exception | None = None) -> None:
        self.nodes = {NodeID(k): v for k, v in nodes.items()}
        self.accept, self.fail, self.calls = accept, fail, []

    def get_all_node_info(self, timeout=None):
        return self.nodes

    def drain_node(self, node_id, reason, reason_message, deadline_timestamp_ms):
        if self.fail:
            raise self.fail
        self.calls.append((node_id, reason, reason_message, deadline_timestamp_ms))
        return self.accept, "" if self.accept else "node is already draining"


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


HERE = "/tmp/ray/session_x/sockets/raylet"  # the same path in every pod of the cluster
NODES = {"aa" * 28: Info(HERE, node_manager_address="10.0.0.3"), "bb" * 28: Info(HERE),
         "cc" * 28: Info(HERE, True, node_manager_address="10.0.0.1"), "dd" * 28: Info("/elsewhere", node_manager_address="10.0.0.2")}


def run(gcs, states, deadline_s=50.0, proxies=frozenset({7}), connections=lambda pid: []):
    clock, lines = Clock(), []
    seq = iter(states)
    last = [None]

    def state(before):
        assert before == set(proxies)  # the HAProxy processes seen before the drain are the ones waited for
        last[0] = next(seq, last[0])
        return last[0]

    out = d.drain(gcs, deadline_s, reason=3, ip=ip[0], state=state, proxies_now=lambda: set(proxies), log=lines.append,
                  clock=clock, wall_ms=lambda: 1_000_000, sleep=clock.sleep, raylet_socket_exists=lambda p: p == HERE,
                  connections=connections)
    return out, lines, clock.t


ip = ["10.0.0.2"]  # this pod's


def test_drains_its_own_node_with_the_deadline_and_waits_for_replicas_and_old_proxies():
    gcs = FakeGcs(NODES)
    busy = d.Local(replicas=("ray::ServeReplica:llm:Decode:tiny",), old_proxies=(7,))
    proxy_only = d.Local(replicas=(), old_proxies=(7,))
    out, lines, waited = run(gcs, [busy, busy, proxy_only, d.Local((), ())])
    assert gcs.calls == [("bb" * 28, 3, gcs.calls[0][2], 1_000_000 + 50_000)]
    assert "is being deleted" in gcs.calls[0][2]
    assert out.done and waited == 3.0
    assert "draining node bbbbbbbbbbbb" in lines[0] and "drained in 3.0s" in lines[-1]


def test_stops_waiting_at_the_deadline_and_says_what_was_left():
    busy = d.Local(replicas=("ray::ServeReplica:llm:Decode:tiny",), old_proxies=())
    out, lines, waited = run(FakeGcs(NODES), [busy], deadline_s=10)
    assert not out.done and waited == pytest.approx(10.0)
    assert "deadline reached with 1 Serve replica(s)" in lines[-1] and "end with the pod" in lines[-1]


def test_a_refused_drain_still_waits_for_the_replicas():
    """KubeRay's autoscaler may have drained the node already (scale-in): wait all the same."""
    busy = d.Local(replicas=("ray::ServeReplica:llm:Prefill:tiny",), old_proxies=())
    out, lines, waited = run(FakeGcs(NODES, accept=False), [busy, d.Local((), ())])
    assert out.done and waited == 1.0
    assert "refused" in lines[0] and "already draining" in lines[0]


def test_the_head_is_never_drained():
    ip[0] = "10.0.0.1"
    try:
        gcs = FakeGcs(NODES)
        out, lines, waited = run(gcs, [])
    finally:
        ip[0] = "10.0.0.2"
    assert out is None and not gcs.calls and waited == 0
    assert "Ray head" in lines[0]


@pytest.mark.parametrize("nodes,fail,says", [
    ({"aa" * 28: Info(HERE, node_manager_address="10.0.0.3")}, None, "cannot find this pod's Ray node"),
    ({"bb" * 28: Info("/elsewhere")}, None, "cannot find this pod's Ray node"),
    ({"bb" * 28: Info(HERE, state=1)}, None, "cannot find this pod's Ray node"),  # DEAD
    (NODES, RuntimeError("GCS unreachable"), "GCS did not take the drain request"),
])
def test_it_never_blocks_the_deletion(nodes, fail, says):
    out, lines, waited = run(FakeGcs(nodes, fail=fail), [])
    assert out is None and waited == 0
    assert says in lines[0] and "stopping without draining" in lines[0]


def test_local_state_reads_serve_replicas_and_the_old_haproxy_from_proc(tmp_path: Path):
    def proc(pid: int, comm: str, argv: list[str]) -> None:
        p = tmp_path / str(pid)
        p.mkdir()
        (p / "comm").write_text(comm + "\n")
        (p / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")

    proc(1, "bash", ["/bin/bash", "-lc", "ray start --block"])
    proc(10, "ray::ServeRepli", ["ray::ServeReplica:llm:Decode:tiny"])
    proc(11, "ray::IDLE", ["ray::IDLE"])
    proc(20, "haproxy", ["haproxy", "-f", "/tmp/haproxy.cfg", "-sf", "21"])
    proc(21, "haproxy", ["haproxy", "-f", "/tmp/haproxy.cfg"])
    (tmp_path / "self").mkdir()
    assert d.haproxy_pids(d.processes(tmp_path)) == {20, 21}
    state = d.local_state({21, 99}, tmp_path)  # 21 ran before the drain (99 has exited since)
    assert state == d.Local(replicas=("ray::ServeReplica:llm:Decode:tiny",), old_proxies=(21,))
    assert not state.done and d.Local((), ()).done


def test_main_never_fails_the_hook(monkeypatch):
    """A bad GCS address: the drain fails, is logged, and the hook still exits 0 (here without `ray stop`)."""
    lines: list[str] = []
    monkeypatch.setattr(d, "_stdout_log", lambda: lines.append)
    monkeypatch.setenv("RAY_ADDRESS", "no-such-address")
    assert d.main(["--deadline-s", "1", "--no-stop"]) == 0
    assert any("stopping without" in line for line in lines)


def test_at_the_deadline_it_names_what_each_old_haproxy_still_holds():
    lingering = d.Local(replicas=(), old_proxies=(7,))
    out, lines, waited = run(FakeGcs(NODES), [lingering], deadline_s=10,
                             connections=lambda pid: ["10.244.0.9:8000 -> 10.244.0.1:51234"] if pid == 7 else [])
    assert out == lingering and waited == pytest.approx(10.0)
    assert "deadline reached with 0 Serve replica(s) [] and 1 old HAProxy" in lines[-2]
    assert lines[-1] == "old HAProxy pid 7 holds 1 established TCP connection(s): 10.244.0.9:8000 -> 10.244.0.1:51234"


def test_tcp_connections_reads_the_process_sockets_from_proc(tmp_path: Path):
    (tmp_path / "7" / "fd").mkdir(parents=True)
    (tmp_path / "7" / "net").mkdir()
    os.symlink("socket:[111]", tmp_path / "7" / "fd" / "3")
    os.symlink("socket:[222]", tmp_path / "7" / "fd" / "4")
    os.symlink("/dev/null", tmp_path / "7" / "fd" / "0")
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    (tmp_path / "7" / "net" / "tcp").write_text(
        header
        + "   0: 0900F40A:1F40 0100F40A:C852 01 00000000:00000000 00:00000000 00000000  1000        0 111 1\n"
        + "   1: 00000000:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 222 1\n"
        + "   2: 0900F40A:1F40 0200F40A:C853 01 00000000:00000000 00:00000000 00000000  1000        0 999 1\n")
    # 111: established, ours; 222: ours but listening; 999: established, another process's
    assert d.tcp_connections(7, tmp_path) == ["10.244.0.9:8000 -> 10.244.0.1:51282"]
    assert d.tcp_connections(8, tmp_path) == []  # exited: nothing, never an error
