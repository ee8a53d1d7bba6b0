"""Start and stop the whole local stack: tiny model, loopback Ray cluster, the app via a serve config.

Shared by the demo (`python -m devstack`) and the test session fixture, so tests exercise
exactly what users run. Deployment goes through Serve's config path (`deploy_apps` with a
ServeDeploySchema), the same one KubeRay's RayService uses, with import_path serve_app.builder:build_app.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import yaml

from serve_app.config import DEFAULT_ROLE_LABEL_KEY
from devstack.cluster import DEFAULT_NODES, HIGH_THROUGHPUT_ENV, SERVE_MODES, LocalRayCluster, NodeSpec, format_cpu
from devstack.ports import DEMO, PortPlan
from devstack.serve_config import local_app_args, serve_deploy_config, with_overrides
from devstack.tiny_model import ensure_tiny_model


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


AppArgs = Callable[..., dict[str, Any]]
# (apps, window s, CPU percent of one core per process title) of every stack measured idle in this process.
IDLE_CPU: list[tuple[str, float, dict[str, float]]] = []


@dataclass
class LocalStack:
    """The demo/test/bench deployment. `apps` maps app name -> (route prefix, mode).

    Defaults serve the tiny model on CPU engines (`local_app_args`). The GPU bench passes its own
    `model_path`, `app_args` (same signature as `local_app_args`) and `nodes` with GPUs.

    `api_keys`: auth on, with these keys (written to `api_keys_file`, which tests rewrite to rotate).
    `pending_apps`: apps expected never to become RUNNING (a role that cannot be placed): start()
    waits only for their frontend and sends them no warm-up request.
    """

    apps: dict[str, tuple[str, str]] = field(default_factory=lambda: {"disagg": ("/", "disaggregated")})
    ports: PortPlan = DEMO
    role_label_key: str = DEFAULT_ROLE_LABEL_KEY
    nodes: tuple[NodeSpec, ...] = DEFAULT_NODES
    model_path: Optional[Path] = None  # None: the tiny model, built on first use
    app_args: AppArgs = local_app_args
    overrides: dict[str, dict[str, Any]] = field(default_factory=dict)  # app name -> {dotted AppConfig path: value}
    api_keys: tuple[str, ...] = ()
    pending_apps: frozenset[str] = frozenset()
    object_store_bytes: int = 256 * 1024**2
    cluster_env: dict[str, str] = field(default_factory=dict)  # for every Ray process of the stack
    serve_mode: str = "high-throughput"  # or "standard": Serve's Python proxy and defaults (cluster.SERVE_MODES)
    deploy_timeout_s: float = 600  # seconds without progress (no replica changing state) before start() gives up
    cluster: LocalRayCluster = field(init=False)
    serve_config: dict[str, Any] = field(init=False, default_factory=dict)
    timings: dict[str, float] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        if self.serve_mode not in SERVE_MODES:
            raise ValueError(f"serve_mode {self.serve_mode!r}: one of {', '.join(SERVE_MODES)}")
        env = {**(HIGH_THROUGHPUT_ENV if self.serve_mode == "high-throughput" else {}), **self.cluster_env}
        self.cluster = LocalRayCluster(role_label_key=self.role_label_key, ports=self.ports, nodes=self.nodes,
                                       object_store_bytes=self.object_store_bytes, extra_env=env)

    @property
    def log_dir(self) -> Path:
        """The Ray session's logs (serve/ holds the replica logs with the frontends' trace lines)."""
        return self.cluster.temp_dir / "session_latest" / "logs"

    @property
    def api_keys_file(self) -> Path:
        return self.cluster.temp_dir / "api-keys"

    @property
    def api_key(self) -> Optional[str]:
        """A key clients of this stack can use (the first one), or None when auth is off."""
        return self.api_keys[0] if self.api_keys else None

    def write_api_keys(self, keys: tuple[str, ...]) -> None:
        """(Re)write the key file the apps read; they pick up a change within a few seconds."""
        path = self.api_keys_file
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = path.with_suffix(".tmp")
        staging.write_text("".join(f"{k}\n" for k in keys))
        staging.chmod(0o600)
        staging.replace(path)  # atomic, like a Kubernetes Secret volume update

    def _overrides(self, app: str) -> dict[str, Any]:
        auth = {"auth.api_keys_file": str(self.api_keys_file)} if self.api_keys else {}
        return {**auth, **self.overrides.get(app, {})}

    def base_url(self, app: str = "disagg") -> str:
        prefix = self.apps[app][0].rstrip("/")
        return f"http://127.0.0.1:{self.ports.http}{prefix}/v1"

    def start(self, *, deploy_timeout_s: Optional[float] = None) -> None:
        t0 = time.monotonic()
        model_path = self.model_path or ensure_tiny_model()
        self.timings["model"] = time.monotonic() - t0
        log(f"model: {model_path} ({self.timings['model']:.1f} s)")
        deploy_timeout_s = deploy_timeout_s or self.deploy_timeout_s

        try:
            self._start_cluster_and_deploy(model_path, deploy_timeout_s)
        except BaseException as exc:  # also Ctrl-C during start-up: leave nothing running
            # A failed start keeps its Ray logs: the error message points the operator at them.
            self.stop(keep_logs=not isinstance(exc, KeyboardInterrupt))
            raise
        self.timings["total"] = time.monotonic() - t0

    def _start_cluster_and_deploy(self, model_path: Path, deploy_timeout_s: float) -> None:
        t1 = time.monotonic()
        log(f"starting Ray on {self.cluster.address} (logs: {self.cluster.temp_dir}/session_latest/logs)")
        self.cluster.start()
        self.timings["ray_start"] = time.monotonic() - t1

        if self.api_keys:
            self.write_api_keys(self.api_keys)
        self.serve_config = self.build_serve_config(model_path)
        config_file = self.cluster.temp_dir / "serve-config.yaml"
        config_file.write_text(yaml.safe_dump(self.serve_config, sort_keys=False))
        t2 = time.monotonic()
        log(f"deploying {', '.join(self.apps)} from {config_file} (engines take 1-3 min on 2 cores)")
        self._deploy_and_wait(deploy_timeout_s)
        self._warm_up()
        self.timings["deploy"] = time.monotonic() - t2

    def build_serve_config(self, model_path: Path) -> dict[str, Any]:
        """The serve config this stack deploys: one application per entry of `apps`, validated."""
        kv_apps = [name for name, (_, mode) in self.apps.items() if mode == "disaggregated"]

        def side_channels(name: str) -> dict[str, int]:
            """Each app that moves KV gets its own NIXL ports (Ray offsets replicas, not apps)."""
            index = kv_apps.index(name) if name in kv_apps else 0
            return {r: self.ports.side_channel_base(r, index) for r in ("prefill", "decode")}

        return serve_deploy_config(
            {
                name: {
                    "route_prefix": prefix,
                    "args": with_overrides(
                        self.app_args(str(model_path), mode=mode, role_label_key=self.role_label_key,
                                      side_channel_ports=side_channels(name)),
                        self._overrides(name),
                    ),
                }
                for name, (prefix, mode) in self.apps.items()
            },
            http_port=self.ports.http,
        )

    def _deploy_and_wait(self, timeout_s: float, config: Optional[dict[str, Any]] = None) -> None:
        """Deploy `config` (default: the stack's serve config) through Serve's config path and wait until
        every app runs; `config` becomes the stack's serve config once Serve took it."""
        import ray
        from serve_app.upstream import serve_private_api as serve_api
        from ray.serve.schema import ServeDeploySchema

        config = self.serve_config if config is None else config
        schema = ServeDeploySchema.model_validate(config)
        if ray.is_initialized():
            raise RuntimeError(
                "LocalStack: this process is already connected to a Ray cluster (an earlier ray.init(), or a "
                "Ray API that starts a local Ray on first use); deploying needs a connection to this stack's "
                f"cluster at {self.cluster.address}. Call ray.shutdown() first."
            )
        ray.init(address=self.cluster.address, logging_level="WARNING", log_to_driver=False)
        try:
            for attempt in (1, 2):
                try:
                    client = serve_api.serve_start(
                        http_options=schema.http_options.model_dump(), proxy_location=schema.proxy_location
                    )
                    break
                except Exception as exc:  # noqa: BLE001 - Serve's proxy start is bounded at 60 s
                    # On a saturated machine the HTTP proxy (HAProxy's manager in high-throughput mode) can
                    # miss Serve's 60 s readiness bound; the controller replaces it, so ask once more.
                    if attempt == 2:
                        raise
                    log(f"serve start: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}; retrying once")
            client.deploy_apps(schema)
            self.serve_config = config
            self._wait_running(timeout_s)
        finally:
            ray.shutdown()

    def _wait_running(self, stall_s: float) -> None:
        """Wait until every app runs. Fails when Serve made no progress for `stall_s` seconds (no replica or
        app changed state), not after a fixed total: on a busy machine each engine is slower to start, but
        a start that is moving is never cut off, and one that is stuck fails in the same time as on an idle one."""
        from ray import serve

        progress_at = time.monotonic()
        last = seen = ""
        while time.monotonic() - progress_at < stall_s:
            apps = serve.status().applications
            states = {name: apps[name].status.value if name in apps else "NOT_STARTED" for name in self.apps}
            summary = ", ".join(f"{n}={s}" for n, s in states.items())
            if summary != last:
                log(f"serve: {summary}")
                last = summary
            replicas = _replica_states(apps)
            if replicas != seen:  # progress: a replica was added, scheduled, initialized, became RUNNING...
                seen, progress_at = replicas, time.monotonic()
            failed = {n: apps[n] for n, s in states.items() if s in ("DEPLOY_FAILED", "UNHEALTHY")}
            if failed:
                details = "\n".join(f"{n}: {a.message}" for n, a in failed.items())
                raise RuntimeError(f"Serve app(s) failed to deploy:\n{details}\nLogs: {self._logs()}")
            if all(s == "RUNNING" or (n in self.pending_apps and _frontend_up(apps.get(n))) for n, s in states.items()):
                return
            time.sleep(2)
        raise TimeoutError(
            f"Serve apps made no progress for {stall_s:.0f} s ({last}; replicas: {seen}). Pending placement "
            f"groups? `ray status --address {self.cluster.address}`; replica logs: {self._logs()}"
        )

    def apply_live(self, app: str, user_config: dict[str, Any], *, timeout_s: float = 120) -> None:
        """Deploy the serve config again with `user_config` (live values) set on every deployment of `app`,
        as a `helm upgrade` of a live value does (args unchanged: Serve reconfigures the replicas in place),
        and wait until the app is RUNNING again."""
        config = json.loads(json.dumps(self.serve_config))
        entry = next(a for a in config["applications"] if a["name"] == app)
        for deployment in entry["deployments"]:
            deployment["user_config"] = {**deployment["user_config"], **user_config}
        self._deploy_and_wait(timeout_s, config)

    def serve_replica_ids(self) -> list[str]:
        """The names of every live Serve replica actor (`SERVE_REPLICA::<app>#<deployment>#<replica id>`, read
        from the GCS): an in-place update keeps them, a replaced replica gets a new id."""
        import ray

        ray.init(address=self.cluster.address, logging_level="WARNING", log_to_driver=False)
        try:
            actors = ray.util.list_named_actors(all_namespaces=True)
            return sorted(a["name"] for a in actors if a["name"].startswith("SERVE_REPLICA::"))
        finally:
            ray.shutdown()

    def model_id(self, app: str) -> str:
        return next(a["args"]["model"]["id"] for a in self.serve_config["applications"] if a["name"] == app)

    def _warm_up(self) -> None:
        """One request per app, long enough for the remote path: the first request through each
        replica pays one-off costs (connections, the NIXL handshake where prewarm is off) that should
        not land on a user's first request."""
        prompt = " ".join(["the quick brown fox jumps over the lazy dog"] * 12)
        for app in self.apps:
            if app in self.pending_apps:
                continue
            body = {"model": self.model_id(app), "prompt": prompt, "max_tokens": 2, "temperature": 0}
            try:
                post_json(f"{self.base_url(app)}/completions", body, timeout_s=180, api_key=self.api_key)
            except urllib.error.HTTPError as exc:
                detail = exc.read().decode(errors="replace")[:800]
                raise RuntimeError(f"warm-up request to app {app!r} failed: HTTP {exc.code}: {detail}") from exc

    def _logs(self) -> str:
        return f"{self.cluster.temp_dir}/session_latest/logs (serve/ and worker-*.err)"

    # vLLM's workers keep spinning on their shm queue for 1 s after their last read, by design, then park: a
    # window that starts right after a request counts that second as idle cost (20 % of a core in the first 5 s
    # of the demo, 1-2 % after).
    IDLE_SETTLE_S = 2.0

    def report_idle_cpu(self, window_s: float) -> dict[str, float]:
        """Measure and log the CPU the stack uses while nothing is sent to it (percent of one core per process
        title), and keep it in IDLE_CPU (the test run's "suite times" table prints it). The window starts
        IDLE_SETTLE_S after the caller's last request."""
        time.sleep(self.IDLE_SETTLE_S)
        usage = self.cluster.cpu_percent(window_s)
        log(f"idle CPU over {window_s:.0f} s ({', '.join(self.apps)}): {format_cpu(usage)}")
        IDLE_CPU.append((", ".join(self.apps), window_s, usage))
        return usage

    @contextlib.contextmanager
    def running(self, *, deploy_timeout_s: Optional[float] = None) -> Iterator["LocalStack"]:
        """Start the stack, yield it, stop it; then fail loudly if any of its processes outlived the stop.
        After the start, the stack's idle CPU is measured for $RLD_IDLE_CPU_WINDOW_S seconds (default 10; 0: off)."""
        self.start(deploy_timeout_s=deploy_timeout_s)
        window_s = float(os.environ.get("RLD_IDLE_CPU_WINDOW_S", "10"))
        try:
            if window_s > 0:
                self.report_idle_cpu(window_s)
            yield self
        finally:
            self.stop()
            left = self.cluster.processes()
            if left:
                raise RuntimeError(f"processes left after stopping the local stack: {[p.pid for p in left]}")

    def stop(self, keep_logs: bool = False) -> int:
        keep = keep_logs or os.environ.get("RLD_KEEP_RAY_LOGS") == "1"
        return self.cluster.stop(keep_logs=keep)


def _replica_states(apps: dict[str, Any]) -> str:
    """Every deployment's replica counts by state, as one comparable string."""
    return "; ".join(
        f"{app}/{name}:" + ",".join(f"{getattr(s, 'value', s)}={n}" for s, n in sorted(d.replica_states.items(), key=str))
        for app, status in sorted(apps.items())
        for name, d in sorted(status.deployments.items())
    )


def _frontend_up(app: Any) -> bool:
    """An app's frontend (the deployment that is not an engine role) has a running replica."""
    if app is None:
        return False
    return any(
        ":" not in name and any(str(getattr(s, "value", s)) == "RUNNING" and n > 0 for s, n in d.replica_states.items())
        for name, d in app.deployments.items()
    )


def post_json(url: str, body: dict[str, Any], *, timeout_s: float, api_key: Optional[str] = None) -> dict[str, Any]:
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return json.loads(response.read())

