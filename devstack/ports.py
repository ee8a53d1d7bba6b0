"""Every TCP port a local stack listens on, planned up front and checked free before anything starts.

Why a plan: Ray picks defaults (agent ports at 52365+, workers at 10002-19999) and several Ray nodes
share one IP here, so each node needs ports of its own; and a port inside the kernel's ephemeral range
(`net.ipv4.ip_local_port_range`, 32768-60999 on most Linux machines) can be taken at any moment by an
outgoing connection of any process, which is how a dashboard agent once failed to bind its metrics port
in the middle of a CI run. So every plan lives below 32768, the named plans below are pairwise disjoint
(a demo, the test suites and the bench run side by side), and `check_free()` names the process that
holds a port before a single `ray start` runs.

Layout of one plan: the HTTP port, plus a block of 1000 ports at `base`:

    base + 0 / + 1            Ray GCS / Ray client server (head)
    base + 10*(i+1) .. + 5    node i: dashboard agent listen/grpc, metrics export, runtime env agent,
                              node manager, object manager
    base + 90 .. + 99         auxiliary servers of a test or bench (e.g. vLLM's own OpenAI server)
    base + 100 + 20*k (+ 10)  NIXL side-channel base of prefill (decode) of the stack's k-th app (k < 5; Ray
                              adds replica rank x TP x PP within a deployment, never across apps)
    base + 200 + 150*i ..+149 node i: Ray worker processes
    base + 800 .. + 849       Serve direct-ingress HTTP servers of ingress replicas (high-throughput mode)
    base + 850 .. + 899       Serve direct-ingress gRPC servers (high-throughput mode)
    base + 900 / + 901        HAProxy stats / metrics (when Serve's HAProxy ingress is on)
    base + 902 / + 903        Serve's fallback proxy HTTP / gRPC (head; HAProxy's backup for an app with no
                              ingress replica up)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

MAX_NODES = 4
BLOCK = 1000
NODE_PORT_FLAGS = (
    "dashboard-agent-listen-port",
    "dashboard-agent-grpc-port",
    "metrics-export-port",
    "runtime-env-agent-port",
    "node-manager-port",
    "object-manager-port",
)
WORKERS_PER_NODE = 150
SIDE_CHANNEL_SPAN = 10  # ports per role and app: replicas x TP x PP of a local stack (CPU: TP = PP = 1)
MAX_APPS_WITH_KV = 5  # apps of one stack that move KV (each needs its own side-channel ports)
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


class PortsBusyError(RuntimeError):
    """Some port of a plan is already taken."""


@dataclass(frozen=True)
class PortPlan:
    """The ports of one local stack: `http` for Serve plus the 1000-port block at `base` (see module doc)."""

    http: int
    base: int

    def __post_init__(self) -> None:
        if not (1024 <= self.base and self.base + BLOCK <= 65536):
            raise ValueError(f"PortPlan.base {self.base}: the block base..base+{BLOCK - 1} must lie in 1024-65535")
        if self.base <= self.http < self.base + BLOCK:
            raise ValueError(f"PortPlan.http {self.http} lies inside its own block {self.base}-{self.base + BLOCK - 1}")

    @property
    def gcs(self) -> int:
        return self.base

    @property
    def ray_client(self) -> int:
        return self.base + 1

    def aux(self, index: int) -> int:
        """Port `index` (0-9) for an auxiliary server of the same test or bench."""
        if not 0 <= index < 10:
            raise ValueError(f"aux port index {index}: 0-9")
        return self.base + 90 + index

    def serve_env(self) -> dict[str, str]:
        """Ray Serve's own port settings for this plan (they matter only in Serve's high-throughput and
        HAProxy modes, whose defaults are fixed ports shared by every stack on the machine, some of them
        inside the ephemeral range)."""
        b = self.base
        return {
            "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(b + 800),
            "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(b + 849),
            "RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT": str(b + 850),
            "RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT": str(b + 899),
            "RAY_SERVE_HAPROXY_STATS_PORT": str(b + 900),
            "RAY_SERVE_HAPROXY_METRICS_PORT": str(b + 901),
            "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT": str(b + 902),
            "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT": str(b + 903),
        }

    def side_channel_base(self, role: str, app_index: int = 0) -> int:
        """Side-channel base of `role` in the stack's `app_index`-th app: each app's engines get their own."""
        if not 0 <= app_index < MAX_APPS_WITH_KV:
            raise ValueError(f"app index {app_index}: a plan has side-channel ports for {MAX_APPS_WITH_KV} apps")
        return self.base + 100 + 2 * SIDE_CHANNEL_SPAN * app_index + {"prefill": 0, "decode": SIDE_CHANNEL_SPAN}[role]

    def node_ports(self, index: int) -> dict[str, int]:
        """`ray start` port flags of node `index` (0 = head)."""
        if not 0 <= index < MAX_NODES:
            raise ValueError(f"node index {index}: a plan has room for {MAX_NODES} nodes")
        first = self.base + 10 * (index + 1)
        ports = {flag: first + offset for offset, flag in enumerate(NODE_PORT_FLAGS)}
        workers = self.base + 200 + WORKERS_PER_NODE * index
        ports["min-worker-port"] = workers
        ports["max-worker-port"] = workers + WORKERS_PER_NODE - 1
        return ports

    def listening(self, nodes: int) -> dict[int, str]:
        """Every port a stack of `nodes` Ray nodes listens on, with what listens there."""
        ports = {self.http: "Serve HTTP", self.gcs: "Ray GCS", self.ray_client: "Ray client server"}
        for app in range(MAX_APPS_WITH_KV):
            for role in ("prefill", "decode"):
                start = self.side_channel_base(role, app)
                ports.update({p: f"NIXL side channel (app {app} {role})" for p in range(start, start + SIDE_CHANNEL_SPAN)})
        ports.update({p: "Serve direct-ingress HTTP" for p in range(self.base + 800, self.base + 850)})
        ports.update({p: "Serve direct-ingress gRPC" for p in range(self.base + 850, self.base + 900)})
        ports.update({self.base + 900: "HAProxy stats", self.base + 901: "HAProxy metrics",
                      self.base + 902: "Serve fallback proxy HTTP", self.base + 903: "Serve fallback proxy gRPC"})
        for i in range(nodes):
            node = self.node_ports(i)
            ports.update({port: f"node {i} {flag}" for flag, port in node.items() if "worker" not in flag})
            for p in range(node["min-worker-port"], node["max-worker-port"] + 1):
                ports[p] = f"node {i} Ray worker"
        return ports

    def check_free(self, nodes: int, *, extra: Optional[dict[int, str]] = None) -> None:
        """Raise PortsBusyError naming each taken port, what it is for here, and who holds it."""
        wanted = {**self.listening(nodes), **(extra or {})}
        taken = sorted(holders_of(set(wanted)).items())
        if taken:
            lines = [f"  {port} ({wanted[port]}): held by {who}" for port, who in taken[:12]]
            more = f"\n  ... and {len(taken) - 12} more" if len(taken) > 12 else ""
            raise PortsBusyError(
                "ports this stack needs are already in use on 127.0.0.0/8:\n" + "\n".join(lines) + more +
                "\nStop that process (another demo, test or bench stack? Ctrl-C it, or `ss -ltnp` to find it), "
                "or start this one on another plan (devstack/ports.py)."
            )


def holders_of(ports: set[int]) -> dict[int, str]:
    """Which of `ports` are bound locally (listening, or the local end of a live connection), and by whom.

    The closing connections a stack leaves behind when it stops (TIME_WAIT, FIN_WAIT..., owned by no
    process any more) do not count: every server here binds with SO_REUSEADDR, which they do not block.
    A live process's connection does (that is how an outgoing connection can steal a server's port)."""
    import psutil

    found: dict[int, str] = {}
    for conn in psutil.net_connections(kind="inet"):
        if not conn.laddr or conn.laddr.port not in ports or conn.laddr.port in found:
            continue
        if conn.status != psutil.CONN_LISTEN and conn.pid is None and conn.status in _TEARDOWN:
            continue
        found[conn.laddr.port] = _describe(conn.pid, conn.status)
    return found


_TEARDOWN = {"TIME_WAIT", "FIN_WAIT1", "FIN_WAIT2", "CLOSE_WAIT", "LAST_ACK", "CLOSING", "CLOSE"}


def _describe(pid: Optional[int], status: str) -> str:
    import psutil

    state = "listening" if status == psutil.CONN_LISTEN else f"a {status} connection"
    if pid is None:
        return f"{state} (process not visible to this user)"
    try:
        proc = psutil.Process(pid)
        cmd = " ".join(proc.cmdline())[:120] or proc.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        cmd = "?"
    return f"{state}, pid {pid} ({cmd})"


def ephemeral_range() -> Optional[tuple[int, int]]:
    """The kernel's range for outgoing connections' local ports, or None where it cannot be read."""
    try:
        low, high = EPHEMERAL_RANGE_FILE.read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return None


def in_ephemeral_range(ports: set[int], span: Optional[tuple[int, int]] = None) -> list[int]:
    span = span if span is not None else ephemeral_range()
    if span is None:
        return []
    return sorted(p for p in ports if span[0] <= p <= span[1])


# The named plans: pairwise disjoint (tests/test_ports.py checks), all below 32768.
DEMO = PortPlan(http=8000, base=11000)
TESTS_SERVE_APP = PortPlan(http=18100, base=12000)
TESTS_LOADTESTS = PortPlan(http=18200, base=13000)
TESTS_RESILIENCE = PortPlan(http=18300, base=14000)
TESTS_OBSERVABILITY = PortPlan(http=18400, base=15000)
BENCH = PortPlan(http=18500, base=16000)
TESTS_FIRST_RUN = PortPlan(http=18600, base=17000)
TESTS_DIRECT = PortPlan(http=18700, base=19000)
TESTS_AUTOSCALING = PortPlan(http=18800, base=21000)

NAMED_PLANS = {
    "demo": DEMO,
    "tests-serve-app": TESTS_SERVE_APP,
    "tests-loadtests": TESTS_LOADTESTS,
    "tests-resilience": TESTS_RESILIENCE,
    "tests-observability": TESTS_OBSERVABILITY,
    "bench": BENCH,
    "tests-first-run": TESTS_FIRST_RUN,
    "tests-direct": TESTS_DIRECT,
    "tests-autoscaling": TESTS_AUTOSCALING,
}
# Ports other local tools of this repo listen on (hack/cluster.sh: RLD_PORT_BASE + 1..6).
OTHER_TOOLS = {"hack/cluster.sh control plane": range(26401, 26407)}


def all_named_ports() -> Iterator[tuple[str, int]]:
    for name, plan in NAMED_PLANS.items():
        for port in plan.listening(MAX_NODES):
            yield name, port
    for name, ports in OTHER_TOOLS.items():
        for port in ports:
            yield name, port
