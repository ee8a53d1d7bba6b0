"""What the real node may change on the host, read before `hack/e2e.sh up` and after `down` (issue 17: `down`
leaves the machine as it was). Each key is one kind of host state; `leftovers(before, after)` names what `down`
left behind (or took away), key by key, so a failing test says what to clean up.

Read with the host's own tools (iptables-save, ip, nft) and /proc; a tool that is missing reads as empty on both
sides, so it cannot make the comparison fail or pass by itself.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

# Daemons the node starts (hack/e2e.sh DAEMONS, the control plane of hack/cluster.sh, docker for image builds).
NODE_EXES = {
    "containerd", "containerd-shim", "containerd-shim-runc-v2", "runc", "kubelet", "kube-proxy", "kube-router",
    "coredns", "socat", "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "ray-operator",
    "dockerd", "pause", "raylet", "gcs_server",  # the last three: what the pods' containers ran
}


def _run(*cmd: str) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def _rules(tool: str) -> list[str]:
    """iptables-save/ip6tables-save without counters, comments, chain headers or COMMIT lines."""
    out = []
    for line in _run(tool).splitlines():
        if not line or line[0] in "#:*" or line == "COMMIT":
            continue
        out.append(re.sub(r"\[\d+:\d+\]", "", line))
    return sorted(out)


def _node_processes() -> list[str]:
    """'<exe name> <cmdline head>' of running processes that are node daemons (one line each, pid left out)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            exe = os.path.basename(os.readlink(proc / "exe"))
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        exe = exe.removesuffix(" (deleted)")
        if exe in NODE_EXES:
            found.append(f"{exe} {cmd[:160]}")
    return sorted(found)


def _sysctl(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return "absent"


def snapshot() -> dict[str, list[str]]:
    links = [re.sub(r"@\S+$", "", line.split(":")[1].strip()) for line in _run("ip", "-o", "link", "show").splitlines()
             if line.count(":") >= 2]
    mounts = sorted({line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()})
    netns = sorted(os.listdir("/var/run/netns")) if os.path.isdir("/var/run/netns") else []
    cgroups = sorted(str(p) for p in Path("/sys/fs/cgroup").glob("*/kubepods*"))
    forward = _sysctl("/proc/sys/net/ipv4/ip_forward")
    bridge_nf = _sysctl("/proc/sys/net/bridge/bridge-nf-call-iptables")
    return {
        "iptables rules": _rules("iptables-save"),
        "ip6tables rules": _rules("ip6tables-save"),
        "nf_tables tables": sorted(line.strip() for line in _run("nft", "list", "tables").splitlines() if line.strip()),
        "ipsets": sorted(_run("ipset", "list", "-n").split()),
        "network links": sorted(links),
        "mounts": mounts,
        "network namespaces": netns,
        "kubepods cgroups": cgroups,
        "node processes": _node_processes(),
        # br_netfilter stays loaded once `up` loaded it (the file appears); its value must be back
        "sysctls": [f"ip_forward={forward}"] + ([f"bridge-nf-call-iptables={bridge_nf}"] if bridge_nf != "absent" else []),
    }


def leftovers(before: dict[str, list[str]], after: dict[str, list[str]]) -> dict[str, dict[str, list[str]]]:
    """Per key, what is there after and not before ("added") and the reverse ("removed"); empty when equal."""
    out: dict[str, dict[str, list[str]]] = {}
    for key in before:
        b, a = set(before[key]), set(after.get(key, []))
        if key == "sysctls" and not any(x.startswith("bridge-nf") for x in b):
            a = {x for x in a if not x.startswith("bridge-nf")}  # the module was not loaded before `up`
        if a != b:
            out[key] = {"added": sorted(a - b), "removed": sorted(b - a)}
    return out
