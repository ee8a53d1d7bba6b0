"""The local port plans (devstack/ports.py): outside the ephemeral range, disjoint, checked before use."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from collections import defaultdict

import pytest

from devstack import ports
from devstack.cluster import DEFAULT_NODES, LocalRayCluster
from devstack.ports import PortPlan, PortsBusyError

LINUX_DEFAULT_EPHEMERAL = (32768, 60999)


def test_every_planned_port_is_below_the_ephemeral_range() -> None:
    planned = {port for _, port in ports.all_named_ports()}
    for span in filter(None, (LINUX_DEFAULT_EPHEMERAL, ports.ephemeral_range())):
        assert ports.in_ephemeral_range(planned, span) == [], f"planned ports inside {span}"


def test_named_plans_and_tools_never_share_a_port() -> None:
    owners: dict[int, set[str]] = defaultdict(set)
    for name, port in ports.all_named_ports():
        owners[port].add(name)
    shared = {port: names for port, names in owners.items() if len(names) > 1}
    assert not shared, f"ports claimed by two plans: {dict(list(shared.items())[:5])}"


@pytest.mark.parametrize("name", sorted(ports.NAMED_PLANS))
def test_a_plan_gives_every_listener_its_own_port(name: str) -> None:
    plan = ports.NAMED_PLANS[name]
    listeners = [plan.http, plan.gcs, plan.ray_client, *(plan.aux(i) for i in range(10))]
    for app in range(ports.MAX_APPS_WITH_KV):
        for role in ("prefill", "decode"):
            start = plan.side_channel_base(role, app)
            listeners += range(start, start + ports.SIDE_CHANNEL_SPAN)
    for i in range(ports.MAX_NODES):
        node = plan.node_ports(i)
        listeners += [p for flag, p in node.items() if "worker" not in flag]
        listeners += range(node["min-worker-port"], node["max-worker-port"] + 1)
    assert len(listeners) == len(set(listeners)), "two listeners of one plan share a port"
    assert all(plan.base <= p < plan.base + ports.BLOCK for p in listeners if p != plan.http)


def test_the_launcher_passes_every_node_port_of_the_plan_to_ray_start() -> None:
    cluster = LocalRayCluster(role_label_key="k", ports=ports.TESTS_FIRST_RUN)
    for index, node in enumerate(DEFAULT_NODES):
        cmd = cluster._start_command(index, node)
        flags = dict(arg[2:].split("=", 1) for arg in cmd if arg.startswith("--") and "=" in arg)
        for flag, port in ports.TESTS_FIRST_RUN.node_ports(index).items():
            assert flags[flag] == str(port)
    head = cluster._start_command(0, DEFAULT_NODES[0])
    assert f"--port={ports.TESTS_FIRST_RUN.gcs}" in head
    assert f"--ray-client-server-port={ports.TESTS_FIRST_RUN.ray_client}" in head


def test_a_taken_port_is_named_with_its_holder_before_anything_starts() -> None:
    plan = PortPlan(http=18699, base=17000)
    taken = plan.node_ports(2)["metrics-export-port"]
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", taken))
        holder.listen()
        with pytest.raises(PortsBusyError) as err:
            plan.check_free(nodes=3)
    message = str(err.value)
    assert f"{taken} (node 2 metrics-export-port): held by listening, pid {os.getpid()}" in message
    plan.check_free(nodes=3)  # released: free again


def test_a_port_used_by_an_outgoing_connection_counts_as_taken() -> None:
    """What broke CI: an outgoing connection's local port is as unavailable to bind() as a listener's."""
    with socket.socket() as server, socket.socket() as client:
        server.bind(("127.0.0.1", 0))
        server.listen()
        client.connect(server.getsockname())
        local_port = client.getsockname()[1]
        assert local_port in ports.holders_of({local_port})


@pytest.mark.parametrize(("http", "base", "message"), [(8000, 500, "1024-65535"), (11005, 11000, "inside its own block")])
def test_a_plan_that_cannot_work_is_refused(http: int, base: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PortPlan(http=http, base=base)


def test_the_readme_points_at_the_demos_real_ports() -> None:
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    decode_metrics = ports.DEMO.node_ports(2)["metrics-export-port"]  # nodes: head, prefill, decode
    assert f"http://127.0.0.2:{decode_metrics}/metrics" in readme
    assert f"http://127.0.0.1:{ports.DEMO.http}/v1" in readme


def test_each_app_that_moves_kv_gets_its_own_side_channel_ports() -> None:
    """Two disaggregated apps in one stack: Ray offsets side-channel ports by replica rank inside one
    deployment only, so each app needs its own bases (or both decode engines bind the same port)."""
    from pathlib import Path

    from devstack.stack import LocalStack

    stack = LocalStack(apps={"a": ("/", "disaggregated"), "b": ("/b", "disaggregated"), "c": ("/c", "aggregated")},
                       ports=ports.TESTS_FIRST_RUN)
    config = stack.build_serve_config(Path("/models/tiny"))
    bases = [(app["args"]["prefill"]["side_channel_port"], app["args"]["decode"]["side_channel_port"])
             for app in config["applications"] if app["args"]["mode"] == "disaggregated"]
    spans = [range(base, base + ports.SIDE_CHANNEL_SPAN) for pair in bases for base in pair]
    assert len({p for span in spans for p in span}) == len(spans) * ports.SIDE_CHANNEL_SPAN, bases
    assert all(p in ports.TESTS_FIRST_RUN.listening(3) for span in spans for p in span)


def test_the_plan_reaches_every_ray_process_and_its_fallback_proxy_ports_are_checked() -> None:
    """Serve's fixed default ports (HAProxy stats/metrics, the fallback proxy) come from the plan, and
    check_free covers them: two stacks on one machine never share one."""
    env = LocalRayCluster(role_label_key="k", ports=ports.TESTS_FIRST_RUN).env()
    listening = ports.TESTS_FIRST_RUN.listening(len(DEFAULT_NODES))
    for key, value in ports.TESTS_FIRST_RUN.serve_env().items():
        assert env[key] == value
        if key.endswith("_PORT"):
            assert int(value) in listening, key


WANTS_TOKEN_AUTH = "from serve_app.upstream import maybe_enable_token_auth; print(maybe_enable_token_auth(False))"


def test_a_ray_token_left_in_home_does_not_turn_token_auth_on_in_the_stack(tmp_path: Path) -> None:
    """Any local `ray.init()` of Ray 2.60 writes ~/.ray/auth_token; a head started with RAY_AUTH_MODE unset
    then turns token auth on and the stack's other nodes cannot join (every local stack failed so)."""
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("0" * 64)
    env = {**LocalRayCluster(role_label_key="k", ports=ports.TESTS_FIRST_RUN).env(), "HOME": str(tmp_path)}

    def wants_token_auth(env: dict[str, str]) -> str:
        run = subprocess.run([sys.executable, "-c", WANTS_TOKEN_AUTH], env=env, capture_output=True, text=True,
                             timeout=120)
        assert run.returncode == 0, run.stderr[-2000:]
        return run.stdout.strip().splitlines()[-1]

    assert wants_token_auth(env) == "False"
    unset = {k: v for k, v in env.items() if k != "RAY_AUTH_MODE"}
    assert wants_token_auth(unset) == "True", "Ray no longer turns token auth on by itself: the setting may go"
