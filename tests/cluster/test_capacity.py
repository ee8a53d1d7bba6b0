"""When a pool cannot hold a role's pods, they stay Pending and the scheduler says why (PodScheduled)."""

import pytest
import yaml

from .kube import CHART, POOL_LABEL, group_pods, pod_summary, scheduling_message, still_true_for, wait_until

P5 = CHART / "examples" / "p5-llama3-70b.yaml"


def decode_nodes(kube) -> int:
    """Nodes the p5 example's decode pods may use (its nodeSelector)."""
    selector = yaml.safe_load(P5.read_text())["decode"]["nodeSelector"]
    assert selector.get(POOL_LABEL) == "decode", f"the p5 example should select the decode pool: {selector}"
    return len(kube.nodes(selector))


CASES = {
    # one decode replica more than the decode pool has hosts
    "pool-too-small": (lambda n: ["--set", f"decode.replicas={n + 1}"], lambda n: n, "Insufficient nvidia.com/gpu"),
    # GPU nodes carry nvidia.com/gpu=true:NoSchedule; decode pods without the toleration fit nowhere
    "no-gpu-toleration": (lambda n: ["--set-json", "decode.tolerations=[]"], lambda n: 0, "had untolerated taint"),
    # a NodePool that does not exist
    "no-such-pool": (lambda n: ["--set", "decode.nodeSelector.karpenter\\.sh/nodepool=decode-h200"], lambda n: 0,
                     "didn't match Pod's node affinity/selector"),
}


@pytest.mark.parametrize("case", CASES)
def test_unschedulable_decode_pods_stay_pending_with_reason(case, release, kube):
    args, running, reason = CASES[case]
    n = decode_nodes(kube)
    rel = release("cap").install("-f", str(P5), *args(n))
    cluster = rel.raycluster()["metadata"]["name"]
    want_decode = rel.values["decode"]["replicas"]

    def decode_settled():
        pods = group_pods(kube, rel.namespace, cluster).get("decode", [])
        run = [p for p in pods if p.status.phase == "Running"]
        stuck = [p for p in pods if p.status.phase == "Pending" and scheduling_message(p)]
        return (run, stuck) if len(pods) == want_decode and len(run) == running(n) and len(stuck) == want_decode - running(n) else None

    run, stuck = wait_until(decode_settled, 60, f"{running(n)} decode pods Running and the rest Pending with a scheduler message",
                            state=lambda: pod_summary(group_pods(kube, rel.namespace, cluster).get("decode", [])))
    assert stuck, "expected at least one unschedulable decode pod"
    for pod in stuck:
        message = scheduling_message(pod)
        assert message.startswith("Unschedulable: "), message
        assert reason in message, f"PodScheduled message of {pod.metadata.name} does not name '{reason}': {message}"
        print(f"[scheduler] {pod.metadata.name}: {message}")
    # the prefill group is unaffected, and the stuck pods stay Pending (no node appears for them)
    prefill = group_pods(kube, rel.namespace, cluster).get("prefill", [])
    assert prefill and all(p.status.phase == "Running" for p in prefill), pod_summary(prefill)
    names = {p.metadata.name for p in stuck}
    still_true_for(lambda: all(p.status.phase == "Pending" for p in kube.pods(rel.namespace) if p.metadata.name in names),
                   3, f"decode pods {sorted(names)} Pending")
