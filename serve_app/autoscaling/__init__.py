"""Prefill/decode-coupled autoscaling (autoscaling.mode: coupled; docs/autoscaling.md).

policy.py      the decision, a pure function (unit-tested over recorded signal traces)
ray_policy.py  Ray Serve's application-level policy: AutoscalingContext -> signals -> decision -> log, metrics
entry.py       the import path the serve config names (Ray pickles that module by value; it only re-exports)
signals.py     the engine replicas' side: vLLM's scheduler/iteration stats -> record_autoscaling_stats
"""
