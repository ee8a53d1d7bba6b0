"""A local multi-node Ray cluster on loopback: a head plus one node per engine role, labelled with its role.

All nodes run on 127.0.0.2: Ray rewrites 127.0.0.1/localhost to the host's own interface address,
but leaves other 127/8 addresses alone (docs/local-stack.md), so Ray traffic stays
on loopback. Each node gets its own agent, metrics and worker ports (devstack/ports.py) so several
raylets share one IP.

Every process of the cluster inherits RLD_CLUSTER_ID and works under /tmp/rld-<id>; `stop()` ends exactly
those processes (and no other Ray on the machine, which a bare `ray stop` would also kill).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import psutil

from devstack.ports import DEMO, PortPlan, in_ephemeral_range
from serve_app.frontend.edge import EDGE_CALLBACK, EDGE_CALLBACK_ENV as EDGE_CALLBACK_ENV_NAME

NODE_IP = "127.0.0.2"
# Ray Serve's high-throughput mode (Ray's KubeRay guide "Enable High Throughput on Ray Serve"): HAProxy in
# place of the Python HTTP proxy, ingress replicas serving HTTP themselves, gRPC between deployments, user
# code on the replica's main thread. Measured on one H200 it halves what serving adds to the time to first
# token (bench/results/2026-12-01-h200). The chart sets the same environment on every Ray container.
HIGH_THROUGHPUT_ENV = {
    "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1", "RAY_SERVE_ENABLE_HA_PROXY": "1",
    # one refused connection marks a replica DOWN in HAProxy (Ray's default: 3), so HAProxy's retry of that request
    # goes to another replica or to its backup (the node's Serve proxy, whose held-request guard answers 503 naming the
    # role) instead of the same dead replica, which ended in HAProxy's plain-text 500; health checks revive a false
    # positive in ~0.5 s. The chart sets the same.
    "RAY_SERVE_HAPROXY_OBSERVE_ERROR_LIMIT": "1",
}
# Serve's own HTTP servers (every node's proxy, HAProxy's backup; each ingress replica's direct ingress) run the app's
# edge middlewares (serve_app/frontend/edge.py): malformed request ids refused, /-/routes closed, and a request the
# proxy holds for an app with no running ingress replica answered 503 naming the role. The chart sets the same.
EDGE_CALLBACK_ENV = {EDGE_CALLBACK_ENV_NAME: EDGE_CALLBACK}
SERVE_MODES = ("high-throughput", "standard")
CLUSTER_ID_ENV = "RLD_CLUSTER_ID"
REPO_ROOT = Path(__file__).resolve().parents[1]
METRICS_REPORT_INTERVAL_MS = 2000


@dataclass(frozen=True)
class NodeSpec:
    name: str
    num_cpus: int
    role: Optional[str] = None  # value of the role label; None for the head
    gpus: tuple[int, ...] = ()  # GPU indices this node owns (its CUDA_VISIBLE_DEVICES); empty: no GPU


DEFAULT_NODES = (
    NodeSpec("head", num_cpus=2),
    NodeSpec("prefill", num_cpus=4, role="prefill"),
    NodeSpec("decode", num_cpus=4, role="decode"),
)


@dataclass
class LocalRayCluster:
    role_label_key: str
    ports: PortPlan = DEMO
    nodes: tuple[NodeSpec, ...] = DEFAULT_NODES
    object_store_bytes: int = 256 * 1024**2
    extra_env: dict[str, str] = field(default_factory=dict)  # for every Ray process (e.g. Serve's own settings)
    cluster_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    @property
    def address(self) -> str:
        return f"{NODE_IP}:{self.ports.gcs}"

    @property
    def temp_dir(self) -> Path:
        # Short: Ray puts unix sockets under it (108-byte path limit).
        return Path("/tmp") / f"rld-{self.cluster_id}"

    def metrics_url(self, node_name: str) -> str:
        index = [n.name for n in self.nodes].index(node_name)
        return f"http://{NODE_IP}:{self.ports.node_ports(index)['metrics-export-port']}/metrics"

    def env(self) -> dict[str, str]:
        """Environment of every Ray process: the app importable, no hub, no telemetry, our marker."""
        env = dict(os.environ)
        env.update(
            {
                CLUSTER_ID_ENV: self.cluster_id,
                "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")])),
                "RAY_USAGE_STATS_ENABLED": "0",
                "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",
                # Export metrics every 2 s (Ray's default is 10 s): fresher numbers for the demo and tests.
                "RAY_metrics_report_interval_ms": str(METRICS_REPORT_INTERVAL_MS),
                # Loopback only, so no token auth, said explicitly: with RAY_AUTH_MODE unset, Ray 2.60's head turns
                # it on when ~/.ray/auth_token exists (any local `ray.init()` writes one), while its other nodes
                # then fail to join ("InvalidAuthToken ... RAY_AUTH_MODE is currently 'disabled'").
                "RAY_AUTH_MODE": "disabled",
                **EDGE_CALLBACK_ENV,
                **self.ports.serve_env(),
                **self.extra_env,
            }
        )
        if env.get("RAY_SERVE_ENABLE_HA_PROXY") == "1" and "RAY_SERVE_HAPROXY_MAXCONN" not in env:
            env["RAY_SERVE_HAPROXY_MAXCONN"] = str(haproxy_maxconn())
        return env

    def _start_command(self, index: int, node: NodeSpec) -> list[str]:
        # Ray's CLI through this interpreter: works in a venv and in a `pip install --target` tree alike.
        cmd = [
            sys.executable, "-m", "ray.scripts.scripts", "start",
            f"--node-ip-address={NODE_IP}",
            f"--num-cpus={node.num_cpus}",
            f"--num-gpus={len(node.gpus)}",
            f"--object-store-memory={self.object_store_bytes}",
            f"--temp-dir={self.temp_dir}",
            "--disable-usage-stats",
        ]  # fmt: skip
        cmd += [f"--{flag}={port}" for flag, port in self.ports.node_ports(index).items()]
        if index == 0:
            cmd += [
                "--head",
                f"--port={self.ports.gcs}",
                f"--ray-client-server-port={self.ports.ray_client}",
                "--include-dashboard=false",
            ]
        else:
            cmd += [f"--address={self.address}"]
        if node.role:
            cmd += [f"--labels={self.role_label_key}={node.role}"]
        return cmd

    def start(self, timeout_s: float = 120, attempts: int = 2) -> None:
        """Start every node. `ray start` gives a raylet 30 s (hard-coded) to register, which a loaded
        2-core machine can miss: then everything is stopped and started once more."""
        self._check_ports_free()
        for attempt in range(1, attempts + 1):
            try:
                self._start_nodes(timeout_s)
                return
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                self.stop(keep_logs=True)
                if attempt == attempts:
                    raise
                first_line = str(exc).splitlines()[0]
                print(f"  ray start failed ({first_line}); retrying ({attempt}/{attempts - 1})", file=sys.stderr)

    def _start_nodes(self, timeout_s: float) -> None:
        for index, node in enumerate(self.nodes):
            started = time.monotonic()
            env = self.env()
            if any(n.gpus for n in self.nodes):
                # Each raylet sees only its own GPUs, so Ray hands each role's engines that role's devices.
                env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, node.gpus))
            result = subprocess.run(
                self._start_command(index, node), env=env, capture_output=True, text=True, timeout=timeout_s
            )
            if result.returncode != 0:
                raise RuntimeError(
                    f"`ray start` for the {node.name} node failed (exit {result.returncode}). "
                    f"stderr tail:\n{result.stderr[-3000:]}\nLogs: {self.temp_dir}/session_latest/logs"
                )
            print(f"  ray node {node.name:<8} up in {time.monotonic() - started:5.1f} s", file=sys.stderr)

    def _check_ports_free(self) -> None:
        """Every port of the plan is free now (else PortsBusyError names each one and its holder), and
        none lies in the kernel's ephemeral range, where any outgoing connection could take it later."""
        listening = self.ports.listening(len(self.nodes))
        risky = in_ephemeral_range(set(listening))
        if risky:
            print(
                f"  WARNING: {len(risky)} planned ports ({risky[0]}-{risky[-1]}) lie in this machine's ephemeral "
                "port range (net.ipv4.ip_local_port_range): an outgoing connection may take one before Ray binds "
                "it. Reserve them (sysctl net.ipv4.ip_local_reserved_ports) or pick a plan below the range.",
                file=sys.stderr,
            )
        self.ports.check_free(len(self.nodes))

    def processes(self) -> list[psutil.Process]:
        """Every live process started for this cluster (raylets, GCS, agents, workers, vLLM engines...).

        Marked by the inherited RLD_CLUSTER_ID, our temp dir on the command line, or a file open under
        it; plus all their descendants. (Ray's agents retitle themselves with setproctitle, which wipes
        /proc/<pid>/environ and cmdline, so the marker alone misses them.)
        """
        temp_dir = str(self.temp_dir)
        ours: dict[int, psutil.Process] = {}
        for proc in psutil.process_iter():
            if proc.pid == os.getpid():
                continue
            try:
                if (
                    proc.environ().get(CLUSTER_ID_ENV) == self.cluster_id
                    or any(temp_dir in arg for arg in proc.cmdline())
                    or any(f.path.startswith(temp_dir) for f in proc.open_files())
                ):
                    ours[proc.pid] = proc
                    ours.update((child.pid, child) for child in proc.children(recursive=True))
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        ours.pop(os.getpid(), None)
        return list(ours.values())

    def memory_bytes(self) -> dict[str, int]:
        """Memory of the cluster's processes: summed RSS (counts shared pages once per process) and USS
        (pages unique to each process; the sum is what stopping the cluster frees, less shared libraries)."""
        rss = uss = 0
        for proc in self.processes():
            try:
                info = proc.memory_full_info()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            rss += info.rss
            uss += info.uss
        return {"rss": rss, "uss": uss}

    def cpu_percent(self, window_s: float) -> dict[str, float]:
        """CPU used by this cluster's processes over the next `window_s` seconds, per process title (Ray's
        `ray::ServeReplica:<app>:<deployment>`, `raylet`, `VLLM::EngineCore`, ...; same titles summed), in
        percent of one core. CPU time, not wall time: a busy machine does not inflate it."""

        def sample() -> dict[int, tuple[str, float]]:
            out = {}
            for proc in self.processes():
                try:
                    times = proc.cpu_times()
                    out[proc.pid] = (_title(proc), times.user + times.system)
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    continue
            return out

        before = sample()
        started = time.monotonic()
        time.sleep(window_s)
        after = sample()
        elapsed = time.monotonic() - started
        by_title: dict[str, float] = {}
        for pid, (title, cpu) in after.items():
            used = cpu - before.get(pid, (title, 0.0))[1]  # a process born in the window counts from 0
            by_title[title] = by_title.get(title, 0.0) + max(0.0, used) / elapsed * 100
        return dict(sorted(by_title.items(), key=lambda kv: -kv[1]))

    def stop(self, grace_s: float = 8, keep_logs: bool = False) -> int:
        """SIGTERM every process of this cluster, SIGKILL what is left after `grace_s`; returns the count."""
        procs = self.processes()
        for proc in procs:
            _signal(proc, signal.SIGTERM)
        _, alive = psutil.wait_procs(procs, timeout=grace_s)
        for proc in alive:
            _signal(proc, signal.SIGKILL)
        psutil.wait_procs(alive, timeout=5)
        # vLLM engines started late (during the TERM wave) inherit the marker too: sweep once more.
        for proc in self.processes():
            _signal(proc, signal.SIGKILL)
        if not keep_logs:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
        return len(procs)


def haproxy_maxconn() -> int:
    """HAProxy's connection limit for this machine: it asks for about 2.5 file descriptors per connection
    and refuses to start past the hard RLIMIT_NOFILE (Ray's default of 20000 connections needs ~50000;
    the limit is 20000 on some hosts)."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard == resource.RLIM_INFINITY:
        return 20000
    return max(256, min(20000, int((hard - 200) / 2.5)))


def _title(proc: psutil.Process) -> str:
    """A process's title without per-instance parts: `ray::ServeReplica:main:Decode:tiny`, `raylet`, ..."""
    cmd = proc.cmdline()
    first = cmd[0] if cmd else proc.name()
    if first.startswith(("ray::", "VLLM::")):
        return first.split()[0].split(".")[0]  # "ray::ServeReplica:app:Dep.method" -> the actor, not its call
    name = Path(first).name
    if name.startswith("python") and len(cmd) > 2 and cmd[1] == "-m":
        return f"python -m {cmd[2]}"
    return name


def format_cpu(percent_by_title: dict[str, float], top: int = 8) -> str:
    """`total 31.2% of a core: raylet 6.1, ray::ServeReplica:llm:Decode:tiny 5.0, ...` (the `top` largest)."""
    total = sum(percent_by_title.values())
    parts = ", ".join(f"{title} {pct:.1f}" for title, pct in list(percent_by_title.items())[:top])
    return f"total {total:.1f}% of a core: {parts}"


def _signal(proc: psutil.Process, sig: int) -> None:
    try:
        proc.send_signal(sig)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        pass
