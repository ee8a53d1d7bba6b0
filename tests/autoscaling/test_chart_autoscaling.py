"""The chart's `autoscaling.*` values: what they render (serve config, worker groups, KubeRay's autoscaler) and
the combinations that must fail `helm template`/`helm install` naming the key. Same helpers and contract
checks as tests/chart (tests/chart/conftest.py, tests/chart/expect.py)."""

from __future__ import annotations

import pytest

from serve_app.config import COUPLED_POLICY_FUNCTION, AppConfig
from tests.chart import expect
from tests.chart.conftest import key_named, render, render_error

API = ["--api-versions", "ray.io/v1/RayService"]


def roles(pmin=1, pmax=4, dmin=1, dmax=3, enabled=(True, True)) -> dict:
    return {"prefill": {"autoscaling": {"enabled": enabled[0], "minReplicas": pmin, "maxReplicas": pmax}},
            "decode": {"autoscaling": {"enabled": enabled[1], "minReplicas": dmin, "maxReplicas": dmax}}}


COUPLED = {**roles(), "autoscaling": {"mode": "coupled", "ratio": {"max": 3}, "decode": {"itlS": 0.05}}}


def test_coupled_renders_the_policy_the_app_reads_and_pods_follow_replicas():
    r = render(values=COUPLED, extra=API)
    expect.check_all(r)  # every field of the render against the values (incl. the policy's kwargs)
    pol = r.app["autoscaling_policy"]
    assert pol["policy_function"] == COUPLED_POLICY_FUNCTION
    assert pol["policy_kwargs"]["autoscaling"]["decode"]["itl_s"] == 0.05
    assert pol["policy_kwargs"]["autoscaling"]["ratio"] == {"max": 3}
    cfg = AppConfig.model_validate(r.args)
    assert cfg.autoscaling.mode == "coupled" and cfg.app_autoscaling_policy()["policy_function"] == pol["policy_function"]
    # GPU pods follow the replicas: KubeRay's in-tree autoscaler on, each group's bounds = the role's bounds
    assert r.cluster["enableInTreeAutoscaling"] is True
    assert {g: (spec["minReplicas"], spec["maxReplicas"]) for g, spec in r.groups.items()} == {
        "prefill": (1, 4), "decode": (1, 3)}


@pytest.mark.parametrize("values", [
    {},  # the default: perDeployment, no role autoscales
    roles(),  # perDeployment with both roles on Serve's request-count policy
    {"autoscaling": {"mode": "off"}},
    {"autoscaling": {"mode": False}},  # an unquoted `off` in a values file
])
def test_other_modes_render_no_application_policy(values):
    r = render(values=values, extra=API)
    expect.check_all(r)
    assert "autoscaling_policy" not in r.app
    assert r.args["autoscaling"]["mode"] in ("perDeployment", "off")


BAD = [
    ("coupled-prefill-fixed", {**roles(enabled=(False, True)), "autoscaling": {"mode": "coupled"}},
     "prefill.autoscaling.enabled", "coupled scales both roles"),
    ("coupled-decode-fixed", {**roles(enabled=(True, False)), "autoscaling": {"mode": "coupled"}},
     "decode.autoscaling.enabled", "coupled scales both roles"),
    ("coupled-aggregated", {**roles(), "mode": "aggregated", "autoscaling": {"mode": "coupled"}},
     "mode", "mode aggregated has one role"),
    ("coupled-from-zero", {**roles(dmin=0), "autoscaling": {"mode": "coupled"}},
     "decode.autoscaling.minReplicas", "0 replicas reports nothing"),
    ("off-with-autoscaled-decode", {**roles(enabled=(False, True)), "autoscaling": {"mode": "off"}},
     "decode.autoscaling.enabled", "autoscaling.mode off runs fixed replicas"),
    ("yaml-off-with-autoscaled-prefill", {**roles(enabled=(True, False)), "autoscaling": {"mode": False}},
     "prefill.autoscaling.enabled", "autoscaling.mode off runs fixed replicas"),
    ("unknown-mode", {"autoscaling": {"mode": "auto"}}, "autoscaling.mode", "must be one of"),
    ("ratio-min-above-max", {**roles(), "autoscaling": {"mode": "coupled", "ratio": {"min": 2, "max": 1}}},
     "autoscaling.ratio.min", "greater than autoscaling.ratio.max"),
    ("ratio-max-unreachable", {**roles(pmin=3, dmax=2), "autoscaling": {"mode": "coupled", "ratio": {"max": 1}}},
     "autoscaling.ratio.max", "prefill.autoscaling.minReplicas (3) over decode.autoscaling.maxReplicas (2)"),
    ("ratio-min-unreachable", {**roles(pmax=2, dmin=2), "autoscaling": {"mode": "coupled", "ratio": {"min": 2}}},
     "autoscaling.ratio.min", "prefill.autoscaling.maxReplicas (2) over decode.autoscaling.minReplicas (2)"),
    ("band-not-below-one", {"autoscaling": {"scaleDownBelow": 1}}, "autoscaling.scaleDownBelow", "exclusiveMaximum"),
    ("kv-target-above-one", {"autoscaling": {"decode": {"kvCacheUsage": 1.5}}}, "autoscaling.decode.kvCacheUsage",
     "maximum"),
    ("short-look-back", {"autoscaling": {"lookBackPeriodS": 5}}, "autoscaling.lookBackPeriodS", "exclusiveMinimum"),
    ("negative-delay", {"autoscaling": {"downscaleDelayS": -1}}, "autoscaling.downscaleDelayS", "minimum"),
    ("typo", {"autoscaling": {"ratios": {"max": 2}}}, "autoscaling.ratios", "additional properties"),
]


@pytest.mark.parametrize("case_id, values, key, reason", BAD, ids=[b[0] for b in BAD])
def test_bad_combinations_fail_naming_the_key(case_id, values, key, reason):
    err = render_error(values=values, extra=API)
    assert key_named(err, key), f"{case_id}: the error does not name {key}:\n{err}"
    assert reason.lower() in err.lower(), f"{case_id}: the error does not say {reason!r}:\n{err}"
