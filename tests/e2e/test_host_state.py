"""tests/e2e/host_state.py: the comparison that holds `hack/e2e.sh down` to leaving the host as `up` found it
(the node fixture reads the host before `up` and after `down`). Here on made-up snapshots; no node needed."""

from __future__ import annotations

import time

from tests.e2e import host_state


def _host(**changes: list[str]) -> dict[str, list[str]]:
    base = {
        "iptables rules": ["-A INPUT -i lo -j ACCEPT"], "ip6tables rules": [], "nf_tables tables": [], "ipsets": [],
        "network links": ["eth0", "lo"], "mounts": ["/", "/proc"], "network namespaces": [], "kubepods cgroups": [],
        "node processes": [], "sysctls": ["ip_forward=0"],
    }
    return {**base, **changes}


def test_the_same_host_has_no_leftovers() -> None:
    assert host_state.leftovers(_host(), _host()) == {}


def test_each_kind_of_leftover_is_named_with_what_was_added_or_removed() -> None:
    after = _host(**{
        "iptables rules": ["-A INPUT -i lo -j ACCEPT", "-A FORWARD -j KUBE-FORWARD"],
        "network links": ["eth0", "lo", "rld-cni0"],
        "mounts": ["/", "/proc", "/tmp/ray-llm-disagg-e2e/kubelet/pods/x/volumes/shm"],
        "node processes": ["containerd-shim-runc-v2 -namespace k8s.io"],
        "sysctls": ["ip_forward=1"],
    })
    left = host_state.leftovers(_host(), after)
    assert set(left) == {"iptables rules", "network links", "mounts", "node processes", "sysctls"}
    assert left["iptables rules"] == {"added": ["-A FORWARD -j KUBE-FORWARD"], "removed": []}
    assert left["sysctls"] == {"added": ["ip_forward=1"], "removed": ["ip_forward=0"]}
    # a rule of the host's own that `down` deleted is a leftover too
    assert host_state.leftovers(_host(), _host(**{"iptables rules": []}))["iptables rules"]["removed"] == [
        "-A INPUT -i lo -j ACCEPT"]


def test_bridge_netfilter_loaded_by_up_is_not_a_leftover_but_its_changed_value_is() -> None:
    # br_netfilter was not loaded before `up` (no sysctl file): the module staying loaded is not held against `down`
    assert host_state.leftovers(_host(), _host(sysctls=["ip_forward=0", "bridge-nf-call-iptables=1"])) == {}
    before = _host(sysctls=["ip_forward=0", "bridge-nf-call-iptables=0"])
    left = host_state.leftovers(before, _host(sysctls=["ip_forward=0", "bridge-nf-call-iptables=1"]))
    assert left == {"sysctls": {"added": ["bridge-nf-call-iptables=1"], "removed": ["bridge-nf-call-iptables=0"]}}


def test_a_snapshot_of_this_host_reads_every_kind_and_equals_itself() -> None:
    now = host_state.snapshot()
    assert set(now) == set(_host())
    assert "lo" in now["network links"] and "/" in now["mounts"]
    assert any(s.startswith("ip_forward=") for s in now["sysctls"])
    # The reading itself must be repeatable (no counters, pids or ordering in it). The host may change beside this
    # test, though: the package's node is up while it runs, and its kube-proxy and kube-router rewrite their
    # iptables chains when they resync. So each kind must read the same in at least one of a few back-to-back pairs;
    # a reader that is not repeatable differs in every pair. Processes come and go and are not held to it.
    unsettled = set(now) - {"node processes"}
    for _ in range(5):
        unsettled &= set(host_state.leftovers(now, now := host_state.snapshot()))
        if not unsettled:
            break
        time.sleep(1)
    assert not unsettled, f"these kinds read differently every time: {sorted(unsettled)}"
