"""The locustfile's own command-line options, and the typed settings read from them.

Every option also reads an environment variable LOCUST_<NAME> (e.g. LOCUST_WORKLOAD) and can be
set in a locust.conf file. The API key additionally falls back to OPENAI_API_KEY.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from .profiles import PROFILES, Api, Profile, get_profile
from .slo import Thresholds


def register(parser: Any) -> None:
    """Add our options to Locust's argument parser (`events.init_command_line_parser`)."""
    g = s = parser  # Locust's web-UI flags (is_secret, include_in_web_ui) need the parser itself
    g.add_argument("--workload", env_var="LOCUST_WORKLOAD", choices=sorted(PROFILES), default="chat",
                   help="workload profile: " + "; ".join(f"{p.name} {p.input_tokens}->{p.output_tokens} tokens "
                                                       f"({p.description})" for p in PROFILES.values()))
    g.add_argument("--api", env_var="LOCUST_API", choices=["chat", "completions"], default="chat",
                   help="/v1/chat/completions or /v1/completions")
    g.add_argument("--input-tokens", env_var="LOCUST_INPUT_TOKENS", type=int, default=0, help="override the profile's prompt tokens")
    g.add_argument("--output-tokens", env_var="LOCUST_OUTPUT_TOKENS", type=int, default=0, help="override the profile's max_tokens")
    g.add_argument("--model", env_var="LOCUST_MODEL", default="", help="model name; default: the first of GET /v1/models")
    g.add_argument("--api-key", env_var="LOCUST_API_KEY", default="", is_secret=True,
                   help="sent as 'Authorization: Bearer <key>'; default: $OPENAI_API_KEY")
    g.add_argument("--no-stream", env_var="LOCUST_NO_STREAM", action="store_true", default=False,
                   help="non-streaming requests (no TTFT/ITL)")
    g.add_argument("--no-ignore-eos", env_var="LOCUST_NO_IGNORE_EOS", action="store_true", default=False,
                   help="do not send vLLM's ignore_eos (needed for servers that reject unknown fields); "
                        "outputs may then be shorter than --output-tokens")
    g.add_argument("--temperature", env_var="LOCUST_TEMPERATURE", type=float, default=None, include_in_web_ui=False,
                   help="sampling temperature; default: the server's")
    g.add_argument("--request-rate", env_var="LOCUST_REQUEST_RATE", type=float, default=0.0,
                   help="open loop: send this many requests per second in all (Poisson arrivals, shared by the -u "
                        "users), whether earlier ones finished or not, up to --max-in-flight at once; 0 (default): "
                        "closed loop, each user sends its next request when the last one ended")
    g.add_argument("--max-in-flight", env_var="LOCUST_MAX_IN_FLIGHT", type=int, default=512, include_in_web_ui=False,
                   help="open loop: arrivals finding this many requests in flight fail at once as "
                        "'client saturated' (so an overloaded server cannot exhaust the load generator)")
    g.add_argument("--max-requests", env_var="LOCUST_MAX_REQUESTS", type=int, default=0,
                   help="stop after this many requests in this process (0: no limit; -t bounds time)")
    g.add_argument("--request-timeout", env_var="LOCUST_REQUEST_TIMEOUT", type=float, default=300.0,
                   help="seconds a request may wait on the network before it fails")
    g.add_argument("--seed", env_var="LOCUST_SEED", type=int, default=0, help="seed of the prompt generator")
    g.add_argument("--calibration-file", env_var="LOCUST_CALIBRATION_FILE", default="", include_in_web_ui=False,
                   help="reuse the prompt calibration stored in this JSON file if it was made for the same "
                        "server, model, API and workload; otherwise calibrate and store it there")
    g.add_argument("--summary-json", env_var="LOCUST_SUMMARY_JSON", default="", include_in_web_ui=False,
                   help="write exact percentiles, throughput and the SLO verdict to this JSON file")
    g.add_argument("--samples-jsonl", env_var="LOCUST_SAMPLES_JSONL", default="", include_in_web_ui=False,
                   help="write one JSON line per finished request (start/end wall time, ok, TTFT, mean ITL, E2E, "
                        "tokens, error) to this file: per-request SLO checks (goodput), merging runs")
    g.add_argument("--request-id-prefix", env_var="LOCUST_REQUEST_ID_PREFIX", default="", include_in_web_ui=False,
                   help="send `x-request-id: <prefix>-<n>` with request n (servers that log by request id, "
                        "like this project's app, can then be joined to the samples)")
    # SLO thresholds: with any of them set, the exit code is 0 when all pass and 3 when one fails.
    s.add_argument("--slo-ttft-p95-ms", env_var="LOCUST_SLO_TTFT_P95_MS", type=float, default=None, include_in_web_ui=False,
                   help="SLO: largest allowed p95 time to first token (ms)")
    s.add_argument("--slo-itl-p95-ms", env_var="LOCUST_SLO_ITL_P95_MS", type=float, default=None, include_in_web_ui=False,
                   help="SLO: largest allowed p95 inter-token latency (ms)")
    s.add_argument("--slo-e2e-p95-ms", env_var="LOCUST_SLO_E2E_P95_MS", type=float, default=None, include_in_web_ui=False,
                   help="SLO: largest allowed p95 end-to-end latency (ms)")
    s.add_argument("--slo-error-rate", env_var="LOCUST_SLO_ERROR_RATE", type=float, default=None, include_in_web_ui=False,
                   help="SLO: largest allowed fraction of failed requests, e.g. 0.01")
    s.add_argument("--slo-min-requests", env_var="LOCUST_SLO_MIN_REQUESTS", type=int, default=1, include_in_web_ui=False,
                   help="SLO: fewest requests (ok + failed) for the verdict to pass")


def _opt_float(v: Any) -> float | None:
    if v is None or v == "" or v == "None":
        return None
    return float(v)


def _bool(v: Any) -> bool:
    if isinstance(v, str):
        return v.strip().lower() in ("1", "true", "yes", "on")
    return bool(v)


@dataclass(frozen=True)
class Settings:
    profile: Profile
    api: Api
    model: str | None
    api_key: str | None
    stream: bool
    ignore_eos: bool
    temperature: float | None
    max_requests: int
    request_rate: float
    max_in_flight: int
    request_timeout_s: float
    seed: int
    summary_json: str | None
    samples_jsonl: str | None
    request_id_prefix: str | None
    calibration_file: str | None
    thresholds: Thresholds

    @classmethod
    def from_options(cls, o: Any) -> Settings:
        api = str(getattr(o, "api", "chat"))
        if api not in ("chat", "completions"):
            raise ValueError(f"--api must be chat or completions, got {api!r}")
        profile = get_profile(str(getattr(o, "workload", "chat"))).with_sizes(
            int(getattr(o, "input_tokens", 0) or 0), int(getattr(o, "output_tokens", 0) or 0))
        max_requests = int(getattr(o, "max_requests", 0) or 0)
        if max_requests < 0:
            raise ValueError(f"--max-requests must be >= 0, got {max_requests}")
        request_rate = float(getattr(o, "request_rate", 0.0) or 0.0)
        if request_rate < 0:
            raise ValueError(f"--request-rate must be >= 0 requests/s, got {request_rate}")
        max_in_flight = int(getattr(o, "max_in_flight", 512) or 512)
        if max_in_flight < 1:
            raise ValueError(f"--max-in-flight must be >= 1, got {max_in_flight}")
        return cls(
            profile=profile,
            api=api,  # type: ignore[arg-type]
            model=(getattr(o, "model", "") or None),
            api_key=(getattr(o, "api_key", "") or os.environ.get("OPENAI_API_KEY") or None),
            stream=not _bool(getattr(o, "no_stream", False)),
            ignore_eos=not _bool(getattr(o, "no_ignore_eos", False)),
            temperature=_opt_float(getattr(o, "temperature", None)),
            max_requests=max_requests,
            request_rate=request_rate,
            max_in_flight=max_in_flight,
            request_timeout_s=float(getattr(o, "request_timeout", 300.0) or 300.0),
            seed=int(getattr(o, "seed", 0) or 0),
            summary_json=(getattr(o, "summary_json", "") or None),
            samples_jsonl=(getattr(o, "samples_jsonl", "") or None),
            request_id_prefix=(getattr(o, "request_id_prefix", "") or None),
            calibration_file=(getattr(o, "calibration_file", "") or None),
            thresholds=Thresholds(
                ttft_p95_ms=_opt_float(getattr(o, "slo_ttft_p95_ms", None)),
                itl_p95_ms=_opt_float(getattr(o, "slo_itl_p95_ms", None)),
                e2e_p95_ms=_opt_float(getattr(o, "slo_e2e_p95_ms", None)),
                error_rate=_opt_float(getattr(o, "slo_error_rate", None)),
                min_requests=int(getattr(o, "slo_min_requests", 1) or 0),
            ),
        )
