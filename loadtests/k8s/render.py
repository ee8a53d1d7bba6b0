"""Render an in-cluster Locust run: a ConfigMap holding the locustfile and a Job running it headless.

    python -m loadtests.k8s.render --release llm --namespace llm --users 16 --run-time 10m \\
        --slo-ttft-p95-ms 2000 --slo-error-rate 0.01 | kubectl apply -f -
    kubectl -n llm wait --for=condition=complete --timeout=15m job/llm-loadtest   # or =failed
    kubectl -n llm logs job/llm-loadtest

The Job targets the chart's serve Service (`<release fullname>-serve-svc:8000`, created by KubeRay),
or any --target-url. Its exit code is the locustfile's: 0 when every SLO passes, 3 when one fails,
so the Job's Complete/Failed condition is the verdict (backoffLimit 0: no retries). Extra Locust
arguments follow `--`. The API key, if any, comes from a Secret (--api-key-secret NAME, key
`api-key`). Reports (CSV, HTML, summary.json) go to /reports: an emptyDir unless --reports-pvc
names a claim; the verdict and a summary line are in the pod log either way. Nothing here is
part of the Helm chart; this renders plain manifests.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

LOADTESTS = Path(__file__).resolve().parents[1]
REPO_ROOT = LOADTESTS.parent
LOCUST_IMAGE = "locustio/locust:2.47.0"  # same Locust as pyproject's test group
MOUNT = "/mnt/locust"
# Mounted at their paths relative to the repo root, so the locustfile imports `loadtests.openai_load`
# in the pod exactly as it does in a checkout.
SOURCES = ["loadtests/__init__.py", "loadtests/locustfile.py"] + sorted(
    f"loadtests/openai_load/{p.name}" for p in (LOADTESTS / "openai_load").glob("*.py")
)
_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _key(path: str) -> str:
    """ConfigMap keys cannot contain '/': loadtests/openai_load/sse.py -> loadtests__openai_load__sse.py."""
    return path.replace("/", "__")


def _seconds(run_time: str) -> int:
    m = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s?)?", run_time.strip())
    if not run_time.strip() or not m or not any(m.groups()):
        raise ValueError(f"--run-time {run_time!r}: use Locust's format, e.g. 90s, 10m, 1h30m")
    h, mi, s = (int(g or 0) for g in m.groups())
    return h * 3600 + mi * 60 + s


def build(a: argparse.Namespace, extra: list[str]) -> list[dict[str, Any]]:
    name = a.name or f"{a.release}-loadtest"
    if not _DNS1123.match(name) or len(name) > 52:
        raise ValueError(f"job name {name!r} must be a DNS-1123 label of at most 52 characters")
    target = a.target_url or f"http://{a.release}-serve-svc:{a.port}"
    run_s = _seconds(a.run_time)
    labels = {"app.kubernetes.io/name": "llm-loadtest", "app.kubernetes.io/instance": name,
              "app.kubernetes.io/part-of": "ray-llm-disagg"}
    data = {_key(p): (REPO_ROOT / p).read_text() for p in SOURCES}
    args = ["-f", f"{MOUNT}/loadtests/locustfile.py", "--headless", "--only-summary", "-H", target,
            "-u", str(a.users), "-r", str(a.spawn_rate or a.users), "-t", a.run_time,
            "--stop-timeout", "30", "--workload", a.workload, "--api", a.api,
            "--csv", "/reports/locust", "--html", "/reports/locust.html",
            "--summary-json", "/reports/summary.json"]
    for flag, value in (("--model", a.model), ("--input-tokens", a.input_tokens),
                        ("--output-tokens", a.output_tokens), ("--max-requests", a.max_requests),
                        ("--slo-ttft-p95-ms", a.slo_ttft_p95_ms), ("--slo-itl-p95-ms", a.slo_itl_p95_ms),
                        ("--slo-e2e-p95-ms", a.slo_e2e_p95_ms), ("--slo-error-rate", a.slo_error_rate)):
        if value:
            args += [flag, str(value)]
    args += extra
    env: list[dict[str, Any]] = [{"name": "HOME", "value": "/tmp"}, {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}]
    if a.api_key_secret:
        env.append({"name": "OPENAI_API_KEY",
                    "valueFrom": {"secretKeyRef": {"name": a.api_key_secret, "key": "api-key"}}})
    configmap = {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": a.namespace, "labels": labels},
        "data": data,
    }
    container = {
        "name": "locust",
        "image": a.image,
        "args": args,
        "env": env,
        "resources": {"requests": {"cpu": "1", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                            "runAsNonRoot": True, "runAsUser": 1000},
        "volumeMounts": [{"name": "locustfile", "mountPath": MOUNT, "readOnly": True},
                         {"name": "reports", "mountPath": "/reports"},
                         {"name": "tmp", "mountPath": "/tmp"}],
    }
    job = {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": a.namespace, "labels": labels},
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": run_s + 600,  # setup, stop timeout and report writing
            "ttlSecondsAfterFinished": 86400,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [container],
                    "volumes": [
                        {"name": "locustfile", "configMap": {
                            "name": name, "items": [{"key": _key(p), "path": p} for p in SOURCES]}},
                        {"name": "reports", **({"persistentVolumeClaim": {"claimName": a.reports_pvc}}
                                               if a.reports_pvc else {"emptyDir": {}})},
                        {"name": "tmp", "emptyDir": {}},
                    ],
                },
            },
        },
    }
    return [configmap, job]


def to_yaml(docs: list[dict[str, Any]]) -> str:
    try:
        import yaml
    except ImportError:  # JSON is YAML too; kubectl reads either
        return "\n---\n".join(json.dumps(d, indent=2) for d in docs) + "\n"
    class _Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:  # no &id001 anchors for shared dicts
            return True

    def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
        style = "|" if "\n" in value else None  # source files as readable block scalars
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    _Dumper.add_representer(str, _str)
    return "---\n".join(yaml.dump(d, Dumper=_Dumper, sort_keys=False, width=120, allow_unicode=True) for d in docs)


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(prog="python -m loadtests.k8s.render", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--release", default="ray-llm-disagg", help="Helm release fullname of the chart")
    p.add_argument("--namespace", default="default")
    p.add_argument("--name", default="", help="Job/ConfigMap name (default <release>-loadtest)")
    p.add_argument("--target-url", default="", help="default http://<release>-serve-svc:<port>")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--image", default=LOCUST_IMAGE)
    p.add_argument("--users", type=int, default=8)
    p.add_argument("--spawn-rate", type=float, default=0, help="default: all users at once")
    p.add_argument("--run-time", default="5m")
    p.add_argument("--workload", default="chat")
    p.add_argument("--api", choices=["chat", "completions"], default="chat")
    p.add_argument("--model", default="")
    p.add_argument("--input-tokens", type=int, default=0)
    p.add_argument("--output-tokens", type=int, default=0)
    p.add_argument("--max-requests", type=int, default=0)
    p.add_argument("--reports-pvc", default="",
                   help="PersistentVolumeClaim for /reports (CSV, HTML, summary.json); default: emptyDir")
    p.add_argument("--api-key-secret", default="", help="Secret with key `api-key` (sent as Bearer)")
    p.add_argument("--slo-ttft-p95-ms", type=float, default=None)
    p.add_argument("--slo-itl-p95-ms", type=float, default=None)
    p.add_argument("--slo-e2e-p95-ms", type=float, default=None)
    p.add_argument("--slo-error-rate", type=float, default=None)
    a = p.parse_args(argv)
    if a.users < 1:
        p.error("--users must be >= 1")
    return a, extra


def main(argv: list[str] | None = None) -> int:
    a, extra = parse(sys.argv[1:] if argv is None else argv)
    try:
        docs = build(a, extra)
    except ValueError as e:
        print(f"render: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(to_yaml(docs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
