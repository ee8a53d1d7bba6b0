"""A Ray worker pod's preStop hook: leave the Ray cluster without cutting the requests that pass through it.

Kubernetes deletes a pod (a node drain or upgrade, a spot interruption, scale-in, `kubectl delete pod`, a cluster
upgrade) by running this hook, then SIGTERM, then SIGKILL when `terminationGracePeriodSeconds` ends. Without the
hook the pod's Ray processes die at once or at the SIGKILL: its engine's requests end with the engine, and every
client connection that entered the cluster through this pod's Serve proxy (HAProxy), kept alive since before the
pod left the Service's endpoints, is cut mid-request (seen on a real node: the client got no response, and the
frontend replica elsewhere logged `client disconnected`, at the SIGKILL 30 s after the deletion).

    python -m serve_app.pod.drain --deadline-s 50     # the chart renders this, deadline = grace - 10 s

1. Ask Ray's GCS to drain this node (reason: preemption, deadline: now + `--deadline-s`). Ray Serve then
   - drains the node's proxy: HAProxy reloads failing its health checks, and its old process closes its
     listener and each kept-alive client connection after the response in flight (HAProxy's soft stop);
   - starts replacements for the node's replicas where there is room, and stops the node's replicas gracefully
     (requests in flight finish) once a replacement runs, or `graceful_shutdown_timeout_s` before the deadline.
2. Wait until no Serve replica runs on this node and no HAProxy process from before the drain is still
   finishing requests, or until the deadline.
3. `ray stop`: the pod ends now, not at the SIGKILL, so KubeRay's replacement pod is not kept waiting.

It never fails the deletion: whatever goes wrong is logged and the pod stops as it would have without the hook.
Its lines go to the container's stdout (`kubectl logs <pod>` while the pod terminates; `rld-drain:` prefix).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional, Protocol

PREFIX = "rld-drain:"
REPLICA_TITLE = "ray::ServeReplica:"
PROC = Path("/proc")
GCS_CONNECT_TIMEOUT_MS = 3_000  # Ray retries the first contact: ~13 s in all when GCS is gone


class Gcs(Protocol):
    """The two GCS calls the hook makes (Ray's InnerGcsClient, `serve_app.upstream`)."""

    def get_all_node_info(self, timeout: Optional[float] = None) -> dict: ...

    def drain_node(self, node_id: str, reason: int, reason_message: str, deadline_timestamp_ms: int) -> tuple: ...


@dataclass(frozen=True)
class Local:
    """What still runs in this pod that a client depends on."""

    replicas: tuple[str, ...]  # Serve replica processes (their titles)
    old_proxies: tuple[int, ...]  # HAProxy processes that were running when the drain began

    @property
    def done(self) -> bool:
        return not self.replicas and not self.old_proxies


def processes(proc: Path = PROC) -> Iterable[tuple[int, str, str]]:
    """(pid, comm, cmdline) of every process this container sees."""
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            comm = (d / "comm").read_text().strip()
            cmdline = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # exited meanwhile
            continue
        yield int(d.name), comm, cmdline


def haproxy_pids(procs: Iterable[tuple[int, str, str]]) -> set[int]:
    return {pid for pid, comm, _ in procs if comm == "haproxy"}


def local_state(before: set[int], proc: Path = PROC) -> Local:
    procs = list(processes(proc))
    replicas = tuple(sorted({cmd.split()[0] for _, _, cmd in procs if cmd.startswith(REPLICA_TITLE)}))
    return Local(replicas=replicas, old_proxies=tuple(sorted(before & haproxy_pids(procs))))


def _addr(hex_addr: str) -> str:
    """`0100000A:1F40` (/proc/net/tcp, little-endian IPv4) -> `10.0.0.1:8000`; IPv6 left as hex."""
    host, port = hex_addr.split(":")
    if len(host) == 8:
        host = ".".join(str(b) for b in reversed(bytes.fromhex(host)))
    return f"{host}:{int(port, 16)}"


def tcp_connections(pid: int, proc: Path = PROC) -> list[str]:
    """The established TCP connections of process `pid` (`local -> peer`), read from its /proc fd table and its
    network namespace's /proc/<pid>/net/tcp{,6}: what keeps an old HAProxy process from finishing its soft stop."""
    try:
        inodes = {os.readlink(f)[len("socket:["):-1] for f in (proc / str(pid) / "fd").iterdir()
                  if os.readlink(f).startswith("socket:[")}
    except OSError:
        return []
    out = []
    for table in ("tcp", "tcp6"):
        try:
            rows = (proc / str(pid) / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            f = row.split()
            if len(f) > 9 and f[3] == "01" and f[9] in inodes:  # 01: ESTABLISHED
                out.append(f"{_addr(f[1])} -> {_addr(f[2])}")
    return sorted(out)


def this_node(gcs: Gcs, ip: str, raylet_socket_exists: Callable[[str], bool] = os.path.exists) -> tuple[str, bool]:
    """(node id hex, is head) of the alive Ray node at this pod's IP (the address `ray start` chose here) whose
    raylet socket is in this container. The IP tells the pods apart (the socket path is the same in each pod:
    it is under the cluster's session directory); the socket tells apart nodes sharing one IP (a local cluster)."""
    mine = [(nid, info) for nid, info in gcs.get_all_node_info(timeout=10).items()
            if info.state == 0 and info.node_manager_address == ip  # 0: ALIVE
            and raylet_socket_exists(info.raylet_socket_name)]
    if len(mine) != 1:
        raise LookupError(f"expected one alive Ray node at {ip} with its raylet socket in this pod, found {len(mine)}")
    nid, info = mine[0]
    return nid.hex(), bool(info.is_head_node)


def drain(
    gcs: Gcs,
    deadline_s: float,
    *,
    reason: int,
    ip: str,
    state: Callable[[set[int]], Local],
    proxies_now: Callable[[], set[int]],
    log: Callable[[str], None],
    clock: Callable[[], float] = time.monotonic,
    wall_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    sleep: Callable[[float], None] = time.sleep,
    poll_s: float = 1.0,
    raylet_socket_exists: Callable[[str], bool] = os.path.exists,
    connections: Callable[[int], list[str]] = tcp_connections,
) -> Local | None:
    """Steps 1 and 2. Returns what was still running when it stopped waiting (None: nothing was drained)."""
    end = clock() + deadline_s
    try:
        node_id, head = this_node(gcs, ip, raylet_socket_exists)
    except Exception as e:  # noqa: BLE001 - the hook must never block the deletion
        log(f"cannot find this pod's Ray node ({type(e).__name__}: {e}); stopping without draining")
        return None
    if head:
        log(f"node {node_id[:12]} is the Ray head (GCS, Serve controller): not drained")
        return None
    before = proxies_now()
    try:
        accepted, why = gcs.drain_node(node_id, reason, f"pod {socket.gethostname()} is being deleted",
                                       wall_ms() + int(deadline_s * 1000))
    except Exception as e:  # noqa: BLE001
        log(f"GCS did not take the drain request for node {node_id[:12]} ({type(e).__name__}: {e}); "
            "stopping without draining")
        return None
    if not accepted:  # e.g. already draining (KubeRay's autoscaler scaling in): wait all the same
        log(f"GCS refused to drain node {node_id[:12]}: {why}; waiting for its replicas anyway")
    else:
        log(f"draining node {node_id[:12]} within {deadline_s:.0f}s: Serve moves or stops its replicas, "
            f"its proxy closes client connections after their current response")
    now = state(before)
    while not now.done and clock() < end:
        sleep(poll_s)
        now = state(before)
    if now.done:
        log(f"node {node_id[:12]} drained in {deadline_s - (end - clock()):.1f}s")
    else:
        log(f"deadline reached with {len(now.replicas)} Serve replica(s) {list(now.replicas)} and "
            f"{len(now.old_proxies)} old HAProxy process(es) still running here: their requests end with the pod")
        for pid in now.old_proxies:  # what kept it: its open connections (client -> :8000, or to a replica)
            held = connections(pid)
            log(f"old HAProxy pid {pid} holds {len(held)} established TCP connection(s): "
                f"{', '.join(held[:10]) or 'none'}{' ...' if len(held) > 10 else ''}")
    return now


def _stdout_log() -> Callable[[str], None]:
    """Lines for `kubectl logs`: a preStop hook's own output is shown only when it fails, so write to the
    container's main process stdout when we can."""
    try:
        out = open("/proc/1/fd/1", "a", buffering=1)  # noqa: SIM115 - kept for the hook's life
    except OSError:
        out = sys.stderr
    return lambda line: print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {PREFIX} {line}", file=out, flush=True)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m serve_app.pod.drain", description=__doc__.splitlines()[0])
    p.add_argument("--deadline-s", type=float, required=True,
                   help="seconds Serve gets to move or stop this node's replicas (the chart: grace - 10)")
    p.add_argument("--stop-grace-s", type=int, default=5, help="`ray stop --grace-period`")
    p.add_argument("--no-stop", action="store_true", help="leave Ray running after the drain")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    log = _stdout_log()
    try:
        from ray.util import get_node_ip_address

        from serve_app.upstream import DrainNodeReason, InnerGcsClient, canonicalize_bootstrap_address

        gcs = InnerGcsClient.standalone(canonicalize_bootstrap_address(None), None, GCS_CONNECT_TIMEOUT_MS)
        drain(gcs, args.deadline_s, reason=DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),
              ip=get_node_ip_address(), state=local_state, proxies_now=lambda: haproxy_pids(processes()), log=log)
    except Exception as e:  # noqa: BLE001 - never block the deletion
        log(f"drain failed ({type(e).__name__}: {e}); stopping without it")
    if not args.no_stop:
        ray = Path(sys.executable).with_name("ray")
        subprocess.run([str(ray) if ray.exists() else "ray", "stop", "--grace-period", str(args.stop_grace_s)],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        log("ray stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
