"""Locust load test for OpenAI-compatible LLM endpoints (chat and completions, streaming).

Each user sends one request after another (closed loop: -u is the concurrency). Besides the HTTP
entry (`POST chat` / `POST completions`, whose time is the full streamed response and whose
content size is the output token count), every successful request adds custom entries:

    request_type   value (response-time column)             content-size column
    TTFT           time to first token, ms                  prompt tokens (usage)
    ITL            mean inter-token latency, ms             output tokens
    E2E            end-to-end latency, ms                   output tokens
    TOKENS_PER_S   output tokens / E2E, tokens/s (not ms)   output tokens

They appear in the web UI, the --csv files and the --html report. Exact percentiles (Locust
rounds its own) go to --summary-json. SLO options set the exit code; see loadtests/README.md.

    locust -f loadtests/locustfile.py -H http://127.0.0.1:8000 --headless -u 4 -r 4 -t 60s \
        --profile chat --slo-ttft-p95-ms 500 --slo-error-rate 0.01
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import random
import sys
import time
from pathlib import Path
from typing import Any

import gevent
from gevent.lock import Semaphore
from locust import FastHttpUser, constant, events, task
from locust.env import Environment
from locust.exception import StopUser
from locust.runners import MasterRunner, WorkerRunner
from locust.stats import CSV_STATS_INTERVAL_SEC, RequestStats, StatsEntry

# One import name everywhere, `loadtests.openai_load`: Locust puts only this file's folder on sys.path,
# so add the folder above it (the repo root here, the ConfigMap mount in-cluster).
sys.path.insert(0, str(Path(__file__).absolute().parents[1]))

from loadtests.openai_load import options, prompts, slo  # noqa: E402
from loadtests.openai_load.samples import E2E, ITL, TOKENS_PER_S, TTFT, SampleStore, percentile  # noqa: E402
from loadtests.openai_load.server import Endpoints, ServerProbe, SetupClient  # noqa: E402
from loadtests.openai_load.sse import StreamResult, consume_sse, iter_response_lines  # noqa: E402

log = logging.getLogger("openai_load")

# Locust starts its -t timer with gevent.spawn_later, which counts from the event loop's cached
# clock. If start-up blocked for a while (slow imports on a busy machine) that clock is stale and
# the run ends at once, before any request. Refresh it now that the imports are done.
gevent.get_hub().loop.update_now()


class _Run:
    """State of this load-generator process for one test run."""

    def __init__(self) -> None:
        self.lock = Semaphore()
        self.key: tuple[Any, ...] | None = None
        self.settings: options.Settings | None = None
        self.endpoints: Endpoints | None = None
        self.model: str = ""
        self.factory: prompts.PromptFactory | None = None
        self.calibration: prompts.Calibration | None = None
        self.store = SampleStore()
        self.records: list[dict[str, Any]] = []  # one per finished request, for --samples-jsonl
        self.issued = 0
        self.finished = 0
        self.users_started = 0
        self.setup_error: str | None = None


RUN = _Run()


@events.init_command_line_parser.add_listener
def _add_options(parser: Any) -> None:
    options.register(parser)


def _prepare(environment: Environment) -> None:
    """Read options, find the model, calibrate prompts. Once per process and settings."""
    s = options.Settings.from_options(environment.parsed_options)
    ep = Endpoints.from_host(environment.host or "")
    key = (ep, s)
    with RUN.lock:
        if RUN.key == key and RUN.factory is not None:
            return
        client = SetupClient(ep, s.api_key, timeout_s=min(s.request_timeout_s, 120.0))
        model = s.model or client.first_model()
        cal = _calibration(client, model, ep, s)
        if cal.max_model_len is None:
            cal = dataclasses.replace(cal, max_model_len=client.max_model_len(model))
        profile = s.profile
        if cal.max_model_len and profile.input_tokens + profile.output_tokens > cal.max_model_len:
            clamped = profile.clamp_to(cal.max_model_len)
            log.warning("profile %s: %d+%d tokens exceed max_model_len %d; input clamped to %d",
                        profile.name, profile.input_tokens, profile.output_tokens, cal.max_model_len,
                        clamped.input_tokens)
            s = dataclasses.replace(s, profile=clamped)
        cal.words_for(s.profile.input_tokens)  # fail early if the target is below the overhead
        RUN.key, RUN.settings, RUN.endpoints, RUN.model = key, s, ep, model
        RUN.calibration = cal
        RUN.factory = prompts.PromptFactory(cal, s.api, s.profile.instruction)
        log.info("model %s, api %s, profile %s (%d prompt -> %d output tokens), prompt calibration %s",
                 model, s.api, s.profile.name, s.profile.input_tokens, s.profile.output_tokens, cal.describe())


def _calibration(client: SetupClient, model: str, ep: Endpoints, s: options.Settings) -> prompts.Calibration:
    """Calibrate, or reuse --calibration-file when it was made for this server/model/API/workload."""
    key = {"root": ep.root, "model": model, "api": s.api, "instruction": s.profile.instruction}
    path = s.calibration_file
    if path:
        try:
            with open(path) as f:
                stored = json.load(f)
            if stored.get("key") == key:
                cal = prompts.Calibration.from_json(stored["calibration"])
                log.info("prompt calibration reused from %s", path)
                return cal
        except (OSError, ValueError, KeyError, TypeError):
            pass  # missing or stale: calibrate again
    t0 = time.monotonic()
    cal = prompts.calibrate(ServerProbe(client, model, s.api), s.api, s.profile.instruction, s.seed)
    log.info("prompt calibration took %.1f s", time.monotonic() - t0)
    if path:
        with open(path, "w") as f:
            json.dump({"key": key, "calibration": cal.to_json()}, f)
    return cal


@events.test_start.add_listener
def _on_test_start(environment: Environment, **_: Any) -> None:
    RUN.store = SampleStore()
    RUN.records = []
    RUN.issued = RUN.finished = RUN.users_started = 0
    RUN.setup_error = None
    if isinstance(environment.runner, MasterRunner):
        # The master runs no users; it only needs the settings for the SLO verdict.
        RUN.settings = options.Settings.from_options(environment.parsed_options)
        return
    try:
        _prepare(environment)
    except Exception as e:  # noqa: BLE001 - any setup failure must stop the run with its message
        RUN.setup_error = f"load-test setup failed: {type(e).__name__}: {e}"
        log.error(RUN.setup_error)
        environment.process_exit_code = 2
        if environment.runner is not None:
            gevent.spawn_later(0, environment.runner.quit)


@events.request.add_listener
def _on_request(request_type: str, response_time: float, exception: Any, **_: Any) -> None:
    if request_type in (TTFT, ITL, E2E, TOKENS_PER_S) and exception is None:
        RUN.store.add(request_type, float(response_time))


class OpenAIUser(FastHttpUser):
    """One client. Closed loop (default): sends a request, waits for the whole stream, repeats.
    Open loop (--request-rate R): a Poisson stream of arrivals at R / users per second, each request in a
    greenlet of its own, so a slow server meets the offered rate instead of slowing the client down."""

    wait_time = constant(0)
    concurrency = 1  # connections per user: one request at a time in the closed loop

    def __init__(self, environment: Environment) -> None:
        opts = environment.parsed_options
        # FastHttpUser builds its client from these class attributes in __init__.
        self.network_timeout = float(getattr(opts, "request_timeout", 0) or 300.0)
        self.connection_timeout = min(self.network_timeout, 30.0)
        self.rate = float(getattr(opts, "request_rate", 0) or 0.0) / max(int(getattr(opts, "num_users", 1) or 1), 1)
        if self.rate > 0:
            self.concurrency = int(getattr(opts, "max_in_flight", 512) or 512)
        self.in_flight: set[gevent.Greenlet] = set()
        super().__init__(environment)

    def on_start(self) -> None:
        # Same --seed, same prompts: user n of this process draws from its own seeded stream.
        RUN.users_started += 1
        seed = RUN.settings.seed if RUN.settings else 0
        self.rng = random.Random(f"{seed}-{RUN.users_started}")
        self.arrivals = random.Random(f"{seed}-arrivals-{RUN.users_started}")

    def on_stop(self) -> None:
        # Open loop: requests already sent finish (bounded by Locust's --stop-timeout) and are counted.
        if self.in_flight:
            gevent.joinall(list(self.in_flight))

    @task
    def generate(self) -> None:
        s = self._next_request_allowed()
        if self.rate <= 0:
            RUN.issued += 1
            self._generate_one(s)
            return
        gevent.sleep(self.arrivals.expovariate(self.rate))
        s = self._next_request_allowed()
        RUN.issued += 1
        if len(self.in_flight) >= s.max_in_flight:
            now = time.time()
            error = f"client saturated: {s.max_in_flight} requests in flight (--max-in-flight)"
            self.environment.events.request.fire(
                request_type="POST", name=s.api, response_time=0, response_length=0, context={},
                exception=RuntimeError(error))
            RUN.store.request_done(False, now, now, 0, None, 0)
            if s.samples_jsonl:  # a request the client never sent still counts against the offered rate
                RUN.records.append({"id": None, "ok": False, "start": now, "end": now, "e2e_ms": 0.0, "ttft_ms": None,
                                    "itl_ms": None, "output_tokens": 0, "prompt_tokens": None, "error": error,
                                    "server_trace": None, "client_saturated": True})
            self._finished(s)
            return
        greenlet = gevent.spawn(self._generate_one, s)
        self.in_flight.add(greenlet)
        greenlet.link(self.in_flight.discard)

    def _next_request_allowed(self) -> options.Settings:
        """The settings, or StopUser when setup failed or --max-requests were all sent."""
        s = RUN.settings
        if s is None or RUN.factory is None or RUN.endpoints is None or RUN.setup_error:
            raise StopUser()
        if s.max_requests and RUN.issued >= s.max_requests:
            raise StopUser()
        return s

    def _finished(self, s: options.Settings) -> None:
        RUN.finished += 1
        if s.max_requests and RUN.finished >= s.max_requests:
            self._quit_when_done()

    def _generate_one(self, s: options.Settings) -> None:
        factory, ep = RUN.factory, RUN.endpoints
        assert factory is not None and ep is not None
        body: dict[str, Any] = {"model": RUN.model, **factory.make(s.profile.input_tokens, self.rng),
                                "max_tokens": s.profile.output_tokens, "stream": s.stream}
        if s.stream:
            body["stream_options"] = {"include_usage": True}
        if s.ignore_eos:
            body["ignore_eos"] = True
        if s.temperature is not None:
            body["temperature"] = s.temperature
        headers = {"Accept-Encoding": "identity"}
        if s.api_key:
            headers["Authorization"] = f"Bearer {s.api_key}"
        request_id = f"{s.request_id_prefix}-{RUN.issued}" if s.request_id_prefix else None
        if request_id:
            headers["x-request-id"] = request_id
            headers["x-rld-trace"] = "1"  # servers that keep a per-request record (this project's app) send it
        try:
            self._send(s, ep.path(s.api), body, headers, request_id)
        finally:
            self._finished(s)

    def _send(self, s: options.Settings, path: str, body: dict[str, Any], headers: dict[str, str],
              request_id: str | None = None) -> None:
        label = s.api
        wall0, t0 = time.time(), time.perf_counter()
        with self.client.request("POST", path, name=label, json=body, headers=headers,
                                 stream=s.stream, catch_response=True) as resp:
            problem, result = None, None
            if getattr(resp, "error", None) is not None or resp.status_code != 200:
                problem = _http_problem(resp)
            elif s.stream:
                raw = getattr(resp, "_response", None)
                if raw is None:
                    problem = "response has no body stream"
                else:
                    try:
                        result = consume_sse(iter_response_lines(raw), s.api, t0)
                        problem = result.problem()
                    except Exception as e:  # noqa: BLE001 - broken streams are request failures
                        problem = f"stream broken: {type(e).__name__}: {e}"
            else:
                result, problem = _read_json(resp, s.api, t0)
            e2e_s = result.e2e_s if result is not None else time.perf_counter() - t0
            resp.request_meta["response_time"] = e2e_s * 1000
            resp.request_meta["response_length"] = result.output_tokens if result else 0
            if problem:
                resp.failure(problem)
            else:
                resp.success()
        ok = problem is None and result is not None
        RUN.store.request_done(ok, wall0, wall0 + e2e_s, result.output_tokens if result else 0,
                               result.usage_prompt_tokens if result else None,
                               result.text_chunks if result and s.stream else 0)
        if s.samples_jsonl:
            RUN.records.append({
                "id": request_id, "ok": ok, "start": wall0, "end": wall0 + e2e_s, "e2e_ms": e2e_s * 1000,
                "ttft_ms": result.ttft_s * 1000 if result and result.ttft_s is not None else None,
                "itl_ms": result.itl_s * 1000 if result and result.itl_s is not None else None,
                "output_tokens": result.output_tokens if result else 0,
                "prompt_tokens": result.usage_prompt_tokens if result else None, "error": problem,
                "server_trace": result.server_trace if result else None,
                "gaps": {str(b): n for b, n in result.gap_hist.items()} if result else None})
        if ok:
            assert result is not None
            self._fire_metrics(label, result)

    def _fire_metrics(self, label: str, r: StreamResult) -> None:
        fire = self.environment.events.request.fire
        n = r.output_tokens

        def emit(kind: str, value: float | None, length: int) -> None:
            if value is not None:
                fire(request_type=kind, name=label, response_time=value, response_length=length,
                     exception=None, context={})

        emit(TTFT, r.ttft_s * 1000 if r.ttft_s is not None else None, r.usage_prompt_tokens or 0)
        emit(ITL, r.itl_s * 1000 if r.itl_s is not None else None, n)
        emit(E2E, r.e2e_s * 1000, n)
        emit(TOKENS_PER_S, r.output_tokens_per_s, n)

    def _quit_when_done(self) -> None:
        runner = self.environment.runner
        if runner is not None and not isinstance(runner, WorkerRunner):
            gevent.spawn_later(0, runner.quit)


def _http_problem(resp: Any) -> str:
    err = getattr(resp, "error", None)
    code = resp.status_code
    try:
        text = (resp.text or "")[:300]
    except Exception:  # noqa: BLE001 - the body is only for the message
        text = ""
    if code:
        return f"HTTP {code}: {text}".strip()
    return f"connection error: {err}"


def _read_json(resp: Any, api: str, t0: float) -> tuple[StreamResult, str | None]:
    r = StreamResult()
    try:
        data = json.loads(resp.content or b"null")
    except ValueError:
        r.e2e_s = time.perf_counter() - t0
        return r, "response is not JSON"
    r.e2e_s = time.perf_counter() - t0
    choices = (data or {}).get("choices") or []
    text = ""
    if choices:
        c0 = choices[0]
        text = (c0.get("message") or {}).get("content") or "" if api == "chat" else c0.get("text") or ""
        r.finish_reason = c0.get("finish_reason")
    usage = (data or {}).get("usage") or {}
    r.usage_completion_tokens = usage.get("completion_tokens")
    r.usage_prompt_tokens = usage.get("prompt_tokens")
    r.text_chunks = 1 if text else 0
    r.done = True
    return r, None if text or r.output_tokens else "response carried no generated text"


# ---------------------------------------------------------------------------------------------
# End of run: summary, SLO verdict, exit code


def _merged(stats: RequestStats, request_type: str, names: set[str] | None = None) -> StatsEntry:
    merged = StatsEntry(stats, f"all {request_type}", request_type, use_response_times_cache=False)
    for (name, method), entry in stats.entries.items():
        if method == request_type and (names is None or name in names):
            merged.extend(entry)
    return merged


def _observed(environment: Environment) -> slo.Observed:
    """Exact values from this process, or Locust's (rounded) aggregate on a distributed master."""
    if not isinstance(environment.runner, MasterRunner):
        st = RUN.store
        return slo.Observed(
            requests=st.requests, error_rate=st.error_rate,
            ttft_p95_ms=percentile(st.values[TTFT], 95), itl_p95_ms=percentile(st.values[ITL], 95),
            e2e_p95_ms=percentile(st.values[E2E], 95),
        )
    stats = environment.stats
    post = _merged(stats, "POST", {"chat", "completions"})

    def p95(kind: str) -> float:
        e = _merged(stats, kind)
        return e.get_response_time_percentile(0.95) if e.num_requests else math.nan

    return slo.Observed(
        requests=post.num_requests,
        error_rate=post.num_failures / post.num_requests if post.num_requests else math.nan,
        ttft_p95_ms=p95(TTFT), itl_p95_ms=p95(ITL), e2e_p95_ms=p95(E2E),
    )


@events.quitting.add_listener
def _on_quitting(environment: Environment, **_: Any) -> None:
    if isinstance(environment.runner, WorkerRunner):
        return
    s = RUN.settings
    if s is None:
        if RUN.setup_error is None and not isinstance(environment.runner, MasterRunner):
            # e.g. -t expired while calibration requests were still waiting on the server
            log.error("the run ended before load-test setup finished (is the server ready? is -t "
                      "long enough for the calibration requests?)")
            environment.process_exit_code = 2
        return
    summary: dict[str, Any] = {
        "host": environment.host,
        "model": RUN.model,
        "api": s.api,
        "profile": s.profile.__dict__,
        "stream": s.stream,
        "calibration": RUN.calibration.describe() if RUN.calibration else None,
    }
    if not isinstance(environment.runner, MasterRunner):
        summary.update(RUN.store.summary())
        m = summary["metrics"]
        log.info(
            "summary: %d ok, %d failed, %.2f req/s, %.1f output tokens/s; TTFT p50/p95 %.1f/%.1f ms, "
            "ITL p50/p95 %.2f/%.2f ms, E2E p50 %.1f ms",
            summary["ok"], summary["failed"], summary["requests_per_s"], summary["output_tokens_per_s"],
            m[TTFT]["p50"], m[TTFT]["p95"], m[ITL]["p50"], m[ITL]["p95"], m[E2E]["p50"])
    th = s.thresholds
    if th.enabled:
        obs = _observed(environment)
        checks = slo.evaluate(th, obs)
        environment.process_exit_code = slo.exit_code(checks)
        summary["slo"] = slo.as_dicts(checks)
        summary["slo_passed"] = environment.process_exit_code == slo.EXIT_PASS
        log.info("%s", slo.report(checks))
    if s.summary_json:
        with open(s.summary_json, "w") as f:
            json.dump(summary, f, indent=2, default=str)
    if s.samples_jsonl and not isinstance(environment.runner, MasterRunner):
        with open(s.samples_jsonl, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in RUN.records)
    if getattr(environment.parsed_options, "csv_prefix", None):
        # Locust 2.47 rewrites the --csv files every CSV_STATS_INTERVAL_SEC and never once more at
        # shutdown: without one more pass the files can miss the last second of the run.
        gevent.sleep(CSV_STATS_INTERVAL_SEC + 0.2)
