"""Bad values make `helm template` (hence `helm install`) fail, naming the offending key and the reason.

Each case: values layered on the chart defaults (or on an example), the key the message must name
(dotted; helm's schema errors name it as a JSON path, which `key_named` accepts too), and a fragment
of the reason.
"""

from __future__ import annotations

import pytest

from .conftest import EXAMPLES, key_named, render_error

P5 = {"node.kubernetes.io/instance-type": "p5.48xlarge"}
P5EN = {"node.kubernetes.io/instance-type": "p5en.48xlarge"}
PUSH = {"kvTransfer": {"connector": "NixlPushConnector"}}

# (id, values, key, reason fragment)
INVALID = [
    # --- rules of vLLM's NIXL KV transfer (template checks) ---
    ("decode-pp2-disaggregated", {"decode": {"pipelineParallelSize": 2}},
     "decode.pipelineParallelSize", "no decode-side pipeline parallelism"),
    ("decode-pp2-even-with-push", {**PUSH, "decode": {"pipelineParallelSize": 2}},
     "decode.pipelineParallelSize", "no decode-side pipeline parallelism"),
    ("prefill-pp2-with-pull-connector", {"prefill": {"pipelineParallelSize": 2}},
     "prefill.pipelineParallelSize", "NixlPushConnector"),
    ("prefill-tp-above-decode-tp", {"prefill": {"tensorParallelSize": 8, "gpusPerHost": 8},
                                    "decode": {"tensorParallelSize": 4, "gpusPerHost": 4}},
     "prefill.tensorParallelSize", "allowPrefillTPGreaterThanDecode"),
    ("push-same-side-channel-port", {**PUSH, "decode": {"sideChannelPort": 20000}},
     "decode.sideChannelPort", "its own NIXL side-channel port"),
    # --- hosts and instance types ---
    ("tp-not-multiple-of-gpus-per-host", {"prefill": {"tensorParallelSize": 4, "gpusPerHost": 8},
                                          "decode": {"tensorParallelSize": 4, "gpusPerHost": 4}},
     "prefill.gpusPerHost", "not a multiple of gpusPerHost"),
    ("tp-times-pp-not-multiple", {**PUSH, "prefill": {"tensorParallelSize": 2, "pipelineParallelSize": 3, "gpusPerHost": 4},
                                  "decode": {"tensorParallelSize": 2, "gpusPerHost": 2}},
     "prefill.gpusPerHost", "2 x 3 = 6"),
    ("more-gpus-per-host-than-instance", {"mode": "aggregated",
                                          "decode": {"tensorParallelSize": 16, "gpusPerHost": 16, "nodeSelector": P5}},
     "decode.gpusPerHost", "p5.48xlarge, which has 8 GPUs"),
    ("efa-devices-above-p5en", {"efa": {"enabled": True, "devicesPerHost": 32},
                                "decode": {"tensorParallelSize": 8, "gpusPerHost": 8, "nodeSelector": P5EN}},
     "efa.devicesPerHost", "p5en.48xlarge, which has 16"),
    ("efa-devices-above-p4de", {"efa": {"enabled": True},
                                "prefill": {"nodeSelector": {"node.kubernetes.io/instance-type": "p4de.24xlarge"}}},
     "efa.devicesPerHost", "which has 4"),
    ("hugepages-without-memory-request", {"efa": {"enabled": True}, "prefill": {"resources": {"requests": None, "limits": None}}},
     "prefill.resources", "hugepages-2Mi"),
    # --- backend / accelerator coherence ---
    ("libfabric-without-efa", {"kvTransfer": {"backend": "LIBFABRIC"}},
     "kvTransfer.backend", "needs efa.enabled"),
    ("cpu-with-efa", {"accelerator": "cpu", "efa": {"enabled": True}},
     "efa.enabled", "only for GPU workers"),
    ("cpu-with-cuda-buffers", {"accelerator": "cpu", "kvTransfer": {"bufferDevice": "cuda"}},
     "kvTransfer.bufferDevice", "needs GPU workers"),
    ("cpu-with-accelerator-type", {"accelerator": "cpu", "acceleratorType": "H100"},
     "acceleratorType", "accelerator: cpu"),
    # --- per-role sanity ---
    ("autoscaling-min-above-max", {"prefill": {"autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 2}}},
     "prefill.autoscaling.minReplicas", "greater than prefill.autoscaling.maxReplicas"),
    ("engine-args-reserved-tp", {"decode": {"engineArgs": {"tensor_parallel_size": 4}}},
     "decode.engineArgs.tensor_parallel_size", "set decode.tensorParallelSize instead"),
    ("engine-args-reserved-kv", {"prefill": {"engineArgs": {"kv_transfer_config": {"kv_connector": "X"}}}},
     "prefill.engineArgs.kv_transfer_config", "set kvTransfer instead"),
    ("ray-start-params-labels", {"prefill": {"rayStartParams": {"labels": "a=b"}}},
     "prefill.rayStartParams.labels", "rejects rayStartParams labels"),
    ("ray-labels-override-role", {"decode": {"rayLabels": {"ray-llm-disagg.io/role": "prefill"}}},
     "decode.rayLabels", "set by the chart"),
    # --- names ---
    ("release-name-too-long", {"fullnameOverride": ""}, "fullnameOverride", "at most 47"),
    ("fullname-not-dns1035", {"fullnameOverride": "1llm"}, "fullnameOverride", "DNS-1035"),
    # --- schema (values.schema.json) ---
    ("schema-mode-enum", {"mode": "split"}, "mode", "must be one of"),
    ("schema-connector-enum", {"kvTransfer": {"connector": "P2pNcclConnector"}}, "kvTransfer.connector", "must be one of"),
    ("schema-typo-key", {"prefill": {"tensorParallelsize": 2}}, "prefill.tensorParallelsize", "additional properties"),
    ("schema-unknown-top-level", {"efaEnabled": True}, ".efaEnabled", "additional properties"),
    ("schema-empty-model-source", {"model": {"source": ""}}, "model.source", "minLength"),
    ("schema-tp-zero", {"decode": {"tensorParallelSize": 0}}, "decode.tensorParallelSize", "minimum"),
    ("schema-tp-string", {"decode": {"tensorParallelSize": "8"}}, "decode.tensorParallelSize", "want integer"),
    ("camelcase-engine-arg", {"prefill": {"engineArgs": {"maxModelLen": 8192}}}, "prefill.engineArgs.maxModelLen", "snake_case"),
    ("bad-env-name", {"decode": {"env": {"my-var": "1"}}}, "decode.env.my-var", "environment variable name"),
    ("bad-engine-env-name", {"engineEnv": {"1X": "1"}}, "engineEnv.1X", "environment variable name"),
    ("schema-timeout-zero", {"timeouts": {"firstTokenS": 0}}, "timeouts.firstTokenS", "exclusiveMinimum"),
    ("bad-ray-label-key", {"prefill": {"rayLabels": {"bad key": "x"}}}, "prefill.rayLabels.bad key", "label key"),
    ("http-options-port", {"serve": {"httpOptions": {"port": 9000}}}, "serve.httpOptions.port", "set by the chart"),
    ("schema-side-channel-port-privileged", {"decode": {"sideChannelPort": 80}}, "decode.sideChannelPort", "minimum"),
    ("schema-role-label-key-reserved", {"placement": {"roleLabelKey": "ray.io/role"}}, "placement.roleLabelKey", "not"),
    ("schema-efa-devices-zero", {"efa": {"enabled": True, "devicesPerHost": 0}}, "efa.devicesPerHost", "minimum"),
    ("schema-upgrade-strategy", {"upgradeStrategy": {"type": "Recreate"}}, "upgradeStrategy.type", "must be one of"),
    ("schema-env-not-string", {"decode": {"env": {"VLLM_X": 1}}}, "decode.env.VLLM_X", "want string"),
    ("schema-initializing-timeout", {"initializingTimeout": "two hours"}, "initializingTimeout", "does not match pattern"),
]


@pytest.mark.parametrize(("values", "key", "reason"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID])
def test_invalid_values_fail_naming_the_key(values, key, reason):
    release = "a-release-name-that-is-far-too-long-for-kuberay" if "fullnameOverride" in values and not values["fullnameOverride"] else "llm"
    stderr = render_error(values=values, release=release)
    assert key_named(stderr, key.lstrip(".")), f"stderr does not name {key}:\n{stderr}"
    assert reason in stderr, f"stderr does not give the reason ({reason!r}):\n{stderr}"


def test_at_least_fifteen_invalid_cases():
    assert len(INVALID) >= 15


def test_all_problems_reported_at_once():
    """Several mistakes: one failed install lists them all, each with its key."""
    stderr = render_error(values={"decode": {"pipelineParallelSize": 2}, "kvTransfer": {"backend": "LIBFABRIC"},
                                  "prefill": {"autoscaling": {"enabled": True, "minReplicas": 3, "maxReplicas": 1}}})
    for key in ("decode.pipelineParallelSize", "kvTransfer.backend", "prefill.autoscaling.minReplicas"):
        assert key in stderr


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_examples_reject_decode_pipeline_parallelism(example):
    """The issue's headline check, on every example: decode PP 2 fails at install."""
    stderr = render_error([example], {"mode": "disaggregated", "decode": {"pipelineParallelSize": 2}})
    assert "decode.pipelineParallelSize" in stderr and "pipeline parallelism" in stderr


def test_prefill_tp_above_decode_is_allowed_when_asked():
    from .conftest import render

    r = render(values={"kvTransfer": {"allowPrefillTPGreaterThanDecode": True},
                       "prefill": {"tensorParallelSize": 8, "gpusPerHost": 8},
                       "decode": {"tensorParallelSize": 4, "gpusPerHost": 4}})
    assert r.args["kv_transfer"]["allow_prefill_tp_greater_than_decode"] is True


def test_decode_pp_is_fine_in_aggregated_mode():
    from .conftest import render

    r = render(values={"mode": "aggregated", "decode": {"pipelineParallelSize": 2}})
    assert r.args["decode"]["pipeline_parallel_size"] == 2
