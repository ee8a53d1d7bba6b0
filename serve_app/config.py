"""Typed arguments of the serve app: the `args:` block of serveConfigV2.

These models are the contract between the Helm chart and the app. The chart renders
`applications[].args` from values.yaml; the app validates them here at build time; and the
chart tests validate every rendered serveConfigV2 with the same models. This module imports
only pydantic so the chart tests can use it without Ray or vLLM.

Field names are snake_case (Ray Serve LLM's style). The chart's values are a plain mirror: the
same fields at the same paths, camelCase (`kv_transfer.allow_prefill_tp_greater_than_decode` is
`kvTransfer.allowPrefillTpGreaterThanDecode`), next to Kubernetes-only keys the app never sees. The
chart's values.schema.json takes these fields' rules from this module (hack/values-schema.py), so a new
field here needs a documented values key there (tests/chart says which).
Naming: `engine_env` is the engine processes' environment (Ray runtime_env), `frontend` the
OpenAI-compatible front deployment.
"""

from __future__ import annotations

from typing import Any, Literal, Mapping, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator, model_validator

Role = Literal["prefill", "decode"]

# Engine arguments the app sets itself from other fields; users set those fields instead.
RESERVED_ENGINE_ARGS = {
    "model": "model.source",
    "served_model_name": "model.id",
    "tokenizer": "model.tokenizer_source",
    "tensor_parallel_size": "<role>.tensor_parallel_size",
    "pipeline_parallel_size": "<role>.pipeline_parallel_size",
    "kv_transfer_config": "kv_transfer",
}

# Default Ray node label that names a worker's role. The chart puts it on each worker group
# (KubeRay `labels:`), the app selects it in each role's placement-group bundles.
DEFAULT_ROLE_LABEL_KEY = "ray-llm-disagg.io/role"

# Values a running app takes in place. Serve replaces every replica of an app whose `args` change (the
# app's code version hashes them), engines included; a deployment's `user_config` changes in place (Serve
# calls each replica's `reconfigure`, nothing restarts). These fields are read per request, so the chart
# passes them as every deployment's `user_config` instead of in `args`: a `helm upgrade` that changes only
# them restarts nothing (AppConfig.serve_deployments).
LIVE_FIELDS = ("remote_prefill_min_tokens", "timeouts", "limits")

# Deployment names (the builder's): the frontend, and each engine role's prefix before Ray's name for the
# model (Ray Serve LLM's `_get_deployment_name`; tests/unit/test_live_config.py builds the app to check).
FRONTEND_DEPLOYMENT = "BoundedOpenAiIngress"
ENGINE_DEPLOYMENT_PREFIX = {"prefill": "Prefill:", "decode": "Decode:", "aggregated": "Aggregated:"}


class StrictModel(BaseModel):
    """Unknown keys are errors: a typo in values.yaml must not be silently ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSpec(StrictModel):
    id: str = Field(min_length=1, description="Model name clients send in `model`.")
    source: str = Field(min_length=1, description="HF repo id, s3:// URI or local path of the weights.")
    tokenizer_source: Optional[str] = Field(default=None, description="Tokenizer location if not `source`.")


class AutoscalingSpec(StrictModel):
    enabled: bool = Field(default=True, description="Off: the role runs `replicas` replicas (this block is ignored).")
    min_replicas: int = Field(ge=0)
    max_replicas: int = Field(ge=1)
    target_ongoing_requests: float = Field(default=16, gt=0)

    @model_validator(mode="after")
    def _min_le_max(self) -> "AutoscalingSpec":
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"min_replicas ({self.min_replicas}) must be <= max_replicas ({self.max_replicas})"
            )
        return self


class RoleSpec(StrictModel):
    """One engine role (prefill or decode): its size, parallelism and engine arguments."""

    replicas: int = Field(default=1, ge=0, description="Fixed replicas; ignored while autoscaling is enabled.")
    autoscaling: Optional[AutoscalingSpec] = None
    tensor_parallel_size: int = Field(default=1, ge=1)
    pipeline_parallel_size: int = Field(default=1, ge=1)
    accelerator_type: Optional[str] = Field(
        default=None, description="Ray accelerator type of this role's GPUs, e.g. H100 (GPU only)."
    )
    gpu_fraction: float = Field(
        default=1,
        gt=0,
        le=1,
        description="Share of one GPU each engine worker takes from Ray (GPU only). Below 1, engines share a "
        "GPU (small models, side-by-side comparisons): keep engine_args.gpu_memory_utilization within it. "
        "Needs tensor_parallel_size x pipeline_parallel_size = 1.",
    )
    engine_args: dict[str, Any] = Field(default_factory=dict)
    engine_env: dict[str, str] = Field(
        default_factory=dict, description="Env vars of this role's engines; wins over the app-wide `engine_env`."
    )
    side_channel_port: Optional[int] = Field(
        default=None,
        ge=1024,
        le=65535,
        description="NIXL side-channel base port of this role. NixlConnector: Ray adds each replica's "
        "offset (replica rank x TP x PP), so replicas on one node never collide (unset: Ray's 20000 for "
        "prefill, 22000 for decode). NixlPushConnector: the engine's fixed port, required (Ray 2.58 assigns "
        "none and both engines would bind vLLM's default 5600).",
    )

    @model_validator(mode="after")
    def _engine_args_not_reserved(self) -> "RoleSpec":
        for key in self.engine_args:
            if key in RESERVED_ENGINE_ARGS:
                raise ValueError(
                    f"engine_args.{key} is set by the app; set {RESERVED_ENGINE_ARGS[key]} instead"
                )
        dp = self.engine_args.get("data_parallel_size", 1)
        if not isinstance(dp, int) or dp > 1:
            raise ValueError(
                f"engine_args.data_parallel_size ({dp}): serve_app does not run vLLM data parallelism; "
                "scale with replicas instead"
            )
        return self

    @model_validator(mode="after")
    def _shared_gpu_needs_one_worker(self) -> "RoleSpec":
        if self.gpu_fraction < 1 and self.gpus_per_replica > 1:
            raise ValueError(
                f"gpu_fraction ({self.gpu_fraction}): a shared GPU holds one engine worker; "
                f"tensor_parallel_size x pipeline_parallel_size is {self.gpus_per_replica}"
            )
        return self

    @property
    def autoscaled(self) -> bool:
        return self.autoscaling is not None and self.autoscaling.enabled

    @property
    def gpus_per_replica(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size


class KVTransferSpec(StrictModel):
    """How the KV cache moves from prefill to decode (vLLM KV connector)."""

    connector: Literal["NixlConnector", "NixlPushConnector"] = "NixlConnector"
    backend: Literal["UCX", "LIBFABRIC"] = Field(
        default="UCX", description="NIXL backend: LIBFABRIC for EFA, UCX otherwise."
    )
    buffer_device: Literal["cuda", "cpu"] = "cuda"
    allow_prefill_tp_greater_than_decode: bool = Field(
        default=False, description="NIXL cannot split a prefill TP group across fewer decode ranks."
    )
    prewarm: bool = Field(
        default=True,
        description="Each decode replica sends one tiny request through every prefill replica at start-up, "
        "so the NIXL handshake (100+ ms) does not land on a user's first request.",
    )
    prewarm_timeout_s: float = Field(
        default=120.0,
        gt=0,
        le=3600,
        description="Longest one pre-warm attempt may take, counted from when prefill has a serving replica "
        "(the attempt starts only then). Until a pre-warm finishes, decode prefills every request itself "
        "(failover reason kv_handshake_pending). An attempt not done by then (a prefill replica that never "
        "answered it, or a KV pull that never completed) is cancelled with a warning naming the step it was "
        "stuck in, and tried again, 3 attempts in all; after the last, requests go to prefill anyway, each "
        "bounded by failover.kvTransferTimeoutS. Without it one stuck pre-warm turned disaggregation off for "
        "that replica's life.",
    )
    tokenize_once: bool = Field(
        default=True,
        description="Decode reuses the prompt token ids prefill returns instead of rendering and "
        "tokenizing the prompt again.",
    )
    load_failure_policy: Literal["recompute", "fail"] = Field(
        default="recompute",
        description="What a decode engine does when the KV it should pull cannot be loaded (prefill died, "
        "NIXL transfer error): recompute the prompt locally (the client never sees it), or fail the request "
        "(vLLM's default). vLLM's kv_transfer_config.kv_load_failure_policy.",
    )


class PlacementSpec(StrictModel):
    """Pins each role's placement groups to the Ray nodes of its pool."""

    role_label_key: str = Field(default=DEFAULT_ROLE_LABEL_KEY, min_length=1)
    pin_roles: bool = Field(default=True, description="Add a bundle label selector per role.")
    frontend_label: Optional[dict[str, str]] = Field(
        default=None, description="Ray node label selector for the frontend (e.g. keep it off GPU pools)."
    )


class FrontendSpec(StrictModel):
    """The OpenAI-compatible front deployment (BoundedOpenAiIngress) in front of the engines."""

    replicas: int = Field(default=1, ge=1)
    max_replicas_per_node: Optional[int] = Field(
        default=None,
        ge=1,
        description="Most frontend replicas on one Ray node (Serve's `max_replicas_per_node`; unset: no limit). "
        "Serve's own spreading is best effort: replicas started while only one node had joined (the head, at a "
        "cluster's start) all stay there, and a pod that holds every replica takes the whole frontend with it. "
        "1 keeps them on different nodes; a replica with no node left to take it stays pending.",
    )
    num_cpus: float = Field(default=1, ge=0)
    max_ongoing_requests: int = Field(default=1000, ge=1)
    direct_streaming: bool = Field(
        default=True,
        description="Run the frontend inside each serving engine replica (decode, or the aggregated engine) "
        "instead of as its own deployment (the default): HAProxy sends each request straight to a serving replica "
        "(Ray Serve LLM's direct streaming), one Serve hop fewer. Same guards, same errors; admission and overflow "
        "limits hold per serving replica, and replicas/num_cpus/max_replicas_per_node size nothing. False: the "
        "separate frontend deployment (BoundedOpenAiIngress), which adds that hop (~2.7 ms each request) but "
        "holds admission per frontend replica, retries a request whose decode replica died before its first "
        "chunk, and ends a stream cut by a decode replica's death with an SSE error event.",
    )
    client_trace: bool = Field(
        default=False,
        description="Answer `x-rld-trace: 1` with the request's per-hop timings in the stream (an SSE comment). "
        "Off: the header is ignored; the same record is still logged (RLD_TRACE lines) for operators. On lets "
        "every caller see engine timings and the prefill path (with several tenants: a prefix-cache timing "
        "channel); for benchmarks and single-tenant endpoints.",
    )


class TimeoutSpec(StrictModel):
    """Bounds on how long a client waits on the engines: a dead or wedged engine answers 503, never hangs."""

    first_token_s: float = Field(
        default=300,
        gt=0,
        description="Longest wait from request to the first response chunk (queueing + prefill + KV hand-off).",
    )
    between_tokens_s: float = Field(
        default=60, gt=0, description="Longest silence between two chunks of a streamed response."
    )
    non_stream_per_token_s: float = Field(
        default=0.25,
        gt=0,
        description="A non-streamed response arrives in one piece when generation ends, so its deadline is "
        "first_token_s plus this much per token of its output cap (max_tokens, else the context length): "
        "a healthy long generation is never cut as if the engine were dead.",
    )


class AuthSpec(StrictModel):
    """API keys clients must send as `Authorization: Bearer <key>`. Auth is on when either source is set.

    Keys never appear in the config itself: they come from a file (a mounted Kubernetes Secret, one key
    per line) and/or an env var. The file is re-read when it changes, so keys rotate without a restart:
    add the new key, move clients, remove the old one.
    """

    api_keys_file: Optional[str] = Field(
        default=None, description="File with one API key per line (blank lines and # comments ignored)."
    )
    api_keys_env: Optional[str] = Field(
        default=None, description="Name of an env var holding API keys, separated by commas or newlines."
    )
    cache_salt_per_key: Optional[bool] = Field(
        default=None,
        description="Give each API key its own prefix cache namespace (vLLM `cache_salt`, derived from the key and "
        "combined with the client's own): one tenant cannot tell from timings whether another's prompt is cached. "
        "Unset: on when more than one key is configured. Costs cache hits shared across keys.",
    )
    cors_allow_origins: list[str] = Field(
        default_factory=list,
        description="Browser origins allowed to call the API (CORS, without credentials). Empty: no CORS "
        "headers at all; the API is meant for servers, not browsers.",
    )

    @property
    def enabled(self) -> bool:
        return bool(self.api_keys_file or self.api_keys_env)


class LimitsSpec(StrictModel):
    """Bounds on a single request, checked at the frontend before any engine sees it (4xx naming the field)."""

    max_body_bytes: int = Field(default=4 * 1024**2, ge=1024, description="Larger bodies get 413.")
    body_read_timeout_s: float = Field(
        default=30,
        gt=0,
        le=3600,
        description="Longest a client may take to send its request body, from the frontend's first read of it; "
        "slower: 408 (a body trickled byte by byte would otherwise hold its connection as long as it likes).",
    )
    max_n: int = Field(default=8, ge=1, description="Largest `n` / `best_of` (each one is a full generation).")
    max_tokens: Optional[int] = Field(
        default=None, ge=1, description="Largest `max_tokens` a client may ask for; unset: the context length."
    )
    max_messages: int = Field(default=2048, ge=1, description="Most chat `messages` in one request.")
    max_prompts: int = Field(default=64, ge=1, description="Most prompts in one batched completions request.")
    max_top_level_keys: int = Field(
        default=128,
        ge=32,
        le=4096,
        description="Most top-level fields in a request body (OpenAI's and vLLM's request models have fewer); "
        "more: 400 before anything else is validated.",
    )
    max_stop: int = Field(
        default=4, ge=0, description="Most `stop` strings (each is checked on every generated token). OpenAI's "
        "limit, and all that vLLM >= 0.29's request models accept: more than 4 is refused there anyway.",
    )
    max_stop_chars: int = Field(default=256, ge=1, description="Longest single `stop` string, in characters.")
    max_logit_bias: int = Field(default=300, ge=0, description="Most `logit_bias` entries (OpenAI's limit).")
    max_bad_words: int = Field(
        default=64,
        ge=0,
        description="Most `bad_words` (vLLM checks every one on every decode step, for the whole batch).",
    )
    max_tools: int = Field(default=128, ge=0, description="Most `tools` in one request (OpenAI's limit).")
    max_schema_bytes: int = Field(
        default=32 * 1024,
        ge=256,
        description="Largest JSON schema, as compact JSON: `response_format`, `structured_outputs`, and each "
        "tool's `function.parameters` (each is compiled into a grammar).",
    )
    max_pattern_repeat: int = Field(
        default=1024,
        ge=0,
        le=1 << 20,
        description="Most repetitions the regular expressions of a request's JSON schemas may unroll into, all "
        "together (each `pattern` and `patternProperties` key in `response_format`, `structured_outputs` and tools' "
        "`function.parameters`: `{m,n}` counts its largest count, nested counts multiply). vLLM expands them into "
        "a grammar, superlinearly, when it validates the request (in the serving replica, blocking it) and again "
        "in the engine: a 50-byte `[a-z]{1,20000}` took 42 s of a core; 1024 is ~0.5 s at worst.",
    )
    max_prompt_logprobs: int = Field(
        default=0,
        ge=0,
        description="Largest `prompt_logprobs` (and, with `echo`, `logprobs`/`top_logprobs`): the engine "
        "computes a vocabulary-wide logit row per prompt token outside its memory budget (vLLM #38830). "
        "0: prompt logprobs are refused (400).",
    )


class AdmissionSpec(StrictModel):
    """A bounded queue per frontend replica: up to `max_in_flight` sequences run (a request weighs its prompts x
    n; one heavier than that takes all of them), up to `max_queued` requests wait (at most `max_queue_wait_s`);
    anything beyond gets 429 with Retry-After instead of an unbounded wait.

    Unset limits take the rest of frontend.max_ongoing_requests (what Serve lets reach one frontend replica;
    less overflow.max_in_flight when overflow is on); with neither set, it is split in half."""

    max_in_flight: Optional[int] = Field(default=None, ge=1)
    max_queued: Optional[int] = Field(default=None, ge=0)
    max_queue_wait_s: float = Field(default=30, gt=0)
    retry_after_s: int = Field(default=5, ge=1, description="Retry-After of a 429.")


class FailoverSpec(StrictModel):
    """What decode does when remote prefill fails before the first token, and how fast a missing role is
    reported (disaggregated mode). See serve_app/README.md "Failure semantics"."""

    retry_other_prefill: bool = Field(default=True, description="Retry once on another prefill replica.")
    local_fallback: bool = Field(
        default=True, description="Then prefill on decode itself; off: 503 naming the prefill role."
    )
    routing_timeout_s: float = Field(
        default=2, gt=0, description="Longest wait for a replica of a role to be chosen (none running: fail fast)."
    )
    prefill_timeout_s: float = Field(
        default=30, gt=0, description="Deadline of one remote prefill (queueing + prefill of the whole prompt)."
    )
    suspect_s: float = Field(
        default=15, ge=0, description="A prefill replica that just failed is skipped for this long."
    )
    kv_transfer_timeout_s: float = Field(
        default=120,
        gt=0,
        description="After a remote prefill answered: how long decode waits for a streamed request's first token "
        "(the KV pull from that prefill replica, then decode's first step), and how long it watches for that "
        "replica's role going away meanwhile. Past it, or once the prefill role has no running replica, decode "
        "aborts the pull and prefills locally (or answers 503). Keep it above decode's queueing time at your peak "
        "load (a saturated decode replica can take tens of seconds to start a request's first step; past this "
        "window that request is prefilled again, on decode).",
    )
    max_local_fallbacks: int = Field(
        default=16, ge=0, description="Concurrent local-fallback prefills per decode replica; beyond: 503."
    )
    status_poll_s: float = Field(default=2, gt=0, description="How often role availability is read from Serve.")
    retry_after_s: int = Field(default=10, ge=1, description="Retry-After of a 503 for an unavailable role.")


class ContainmentSpec(StrictModel):
    """A request whose own execution killed an engine (vLLM's EngineDeadError while it ran) is never replayed on
    other engines (no prefill retry, no local fallback, no decode retry); it is fingerprinted, and once the
    same request has killed `strikes` engines within `quarantine_s` it is refused (400) until that window
    ends. One strike is not enough by default: an engine that dies takes every request it was running with
    it, and only the poison one comes back to kill another."""

    enabled: bool = Field(default=True, description="Off: no fingerprints and no refusals (still no replay).")
    strikes: int = Field(default=2, ge=1, description="Engine deaths by the same request before it is refused.")
    quarantine_s: float = Field(
        default=900, gt=0, description="How long a fingerprint's strikes count and a refused request stays refused."
    )
    max_fingerprints: int = Field(default=10000, ge=16, description="Fingerprints kept per frontend replica (oldest dropped).")


class OverflowSpec(StrictModel):
    """Forward requests to an external OpenAI-compatible endpoint when this cluster is saturated or a role
    is unavailable (hybrid routing). Off by default; the key comes from a file or env var, never inline."""

    enabled: bool = False
    base_url: Optional[str] = Field(
        default=None, pattern=r"^https?://", description="e.g. https://api.example.com/v1"
    )
    api_key_file: Optional[str] = Field(default=None, description="File holding the external endpoint's key.")
    api_key_env: Optional[str] = Field(default=None, description="Env var holding the external endpoint's key.")
    model_map: dict[str, str] = Field(
        default_factory=dict, description="Our model id -> the external endpoint's model name (default: same)."
    )
    on_saturation: bool = Field(default=True, description="Overflow when the admission queue is over the threshold.")
    queue_threshold: int = Field(
        default=0, ge=0, description="Overflow once this many requests wait in the admission queue (0: as soon as any would)."
    )
    on_role_unavailable: bool = Field(
        default=True,
        description="Overflow instead of 503 when a role is down. With frontend.direct_streaming (the default) "
        "the frontend runs in the decode replicas, so this covers prefill being down (with "
        "failover.local_fallback off); while no decode replica is up nothing of the app can answer and the Serve "
        "proxy answers 503 decode_unavailable. Overflowing then too needs frontend.direct_streaming false.",
    )
    max_in_flight: int = Field(default=64, ge=1, description="Most concurrent overflowed requests per frontend replica.")
    connect_timeout_s: float = Field(default=5, gt=0)
    max_tokens: int = Field(
        default=4096,
        ge=1,
        description="`max_tokens` sent to the external endpoint when neither the client nor limits.max_tokens "
        "sets one (the external endpoint is paid per token: a request always carries a cap).",
    )
    timeout_s: float = Field(
        default=600, gt=0, description="Longest an overflowed request may take in all (streams included)."
    )
    max_response_bytes: int = Field(
        default=16 * 1024**2, ge=1024, description="Largest response taken from the external endpoint."
    )

    @model_validator(mode="after")
    def _complete_when_enabled(self) -> "OverflowSpec":
        if self.enabled:
            if not self.base_url:
                raise ValueError("overflow.base_url: required when overflow.enabled is true")
            if self.api_key_file and self.api_key_env:
                raise ValueError("overflow: set api_key_file or api_key_env, not both")
        return self

    @model_validator(mode="after")
    def _https_unless_loopback(self) -> "OverflowSpec":
        if self.base_url and self.base_url.startswith("http://") and not is_loopback_url(self.base_url):
            raise ValueError(
                f"overflow.base_url ({self.base_url}): use https://; the endpoint's key would travel in clear "
                "text (http:// is accepted only for localhost/127.0.0.1/::1)"
            )
        return self


def is_loopback_url(url: str) -> bool:
    import ipaddress
    from urllib.parse import urlsplit

    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False

class StreamingSpec(StrictModel):
    """How the serving replica batches streamed chunks into Serve messages (serve_app/telemetry/hops.py)."""

    batch_interval_ms: float = Field(
        default=50,
        ge=0,
        le=1000,
        description="At most one Serve message per stream per interval; chunks arriving sooner travel "
        "together. 0: one message per chunk (costs Python CPU per token on every hop).",
    )
    first_chunk_immediately: bool = Field(
        default=True,
        description="A chunk that arrives after a quiet interval (the first one always does) leaves at "
        "once. Off: Ray's fixed ticks from the start of the stream, which hold the first token for up "
        "to a whole interval.",
    )
    max_messages_per_s: float = Field(
        default=2000,
        ge=0,
        description="Under load, per serving replica: the interval grows with the replica's open streams so that "
        "all of them together send at most this many messages a second (up to max_batch_interval_ms); the "
        "first chunk of a stream still leaves at once and its end is not held, so TTFT and time per output "
        "token are unchanged. 0: the fixed batch_interval_ms. Needs first_chunk_immediately.",
    )
    max_batch_interval_ms: float = Field(
        default=250,
        ge=0,
        le=1000,
        description="The longest interval load may grow it to (below batch_interval_ms: batch_interval_ms).",
    )


class PrefillTargets(StrictModel):
    """What prefill should achieve; prefill is limited by compute, so it scales on its queue and TTFT."""

    ttft_s: float = Field(
        default=2.0,
        gt=0,
        description="Recent time to first token on the prefill engines (their queue + the prompt's prefill, "
        "vLLM's own measure, mean over the look-back window) above which prefill scales up, read while each replica "
        "holds at least 2 requests (running + waiting): with fewer, a replica more would not lower it.",
    )
    waiting_per_replica: float = Field(
        default=4,
        gt=0,
        description="Requests waiting in the prefill engines' queues, per running replica, above which prefill "
        "scales up.",
    )


class DecodeTargets(StrictModel):
    """What decode should achieve; decode is limited by KV-cache memory and bandwidth."""

    itl_s: float = Field(
        default=0.1,
        gt=0,
        description="Recent inter-token latency on the decode engines (vLLM's measure, mean over the look-back "
        "window) above which decode scales up, read while each replica holds at least 2 requests (running + "
        "waiting): with fewer, a replica more would not lower it.",
    )
    kv_cache_usage: float = Field(
        default=0.8,
        gt=0,
        le=1,
        description="Share of the decode engines' KV cache in use (mean over replicas) above which decode "
        "scales up.",
    )
    waiting_per_replica: float = Field(
        default=2,
        gt=0,
        description="Sequences waiting in the decode engines' queues (no KV-cache room yet, or their KV still "
        "arriving), per running replica, above which decode scales up.",
    )
    running_per_replica: Optional[float] = Field(
        default=None,
        gt=0,
        description="Sequences running per decode replica above which decode scales up (unset: not a signal; "
        "set it to the batch size at which your ITL target still holds).",
    )


class RatioSpec(StrictModel):
    """Bounds on prefill replicas / decode replicas; the coupled policy raises the other role (or holds this one)
    to stay within them."""

    min: Optional[float] = Field(default=None, gt=0, description="Least prefill:decode replica ratio (unset: none).")
    max: Optional[float] = Field(default=None, gt=0, description="Largest prefill:decode replica ratio (unset: none).")

    @model_validator(mode="after")
    def _min_le_max(self) -> "RatioSpec":
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"autoscaling.ratio.min ({self.min}) must be <= autoscaling.ratio.max ({self.max})")
        return self


# The application-level policy Ray Serve imports in `coupled` mode (serveConfigV2 applications[].autoscaling_policy).
COUPLED_POLICY_FUNCTION = "serve_app.autoscaling.entry:CoupledPolicy"


class CoupledAutoscalingSpec(StrictModel):
    """How the engine roles scale (docs/autoscaling.md).

    `perDeployment`: each role with `<role>.autoscaling.enabled` scales alone on Ray Serve's request-count
    policy (`target_ongoing_requests`). `coupled`: one application-level policy sets prefill and decode together
    from what the engines report (prefill: queue and TTFT; decode: KV-cache use, running/waiting sequences and
    ITL), within each role's `autoscaling` min/max and the prefill:decode `ratio`. `off`: fixed `replicas`."""

    mode: Literal["coupled", "perDeployment", "off"] = Field(
        default="perDeployment",
        description="coupled: one policy scales prefill and decode together on engine signals (both roles need "
        "autoscaling.enabled; their min/maxReplicas are its bounds); perDeployment: each autoscaled role on Ray "
        "Serve's request-count policy; off: every role runs its fixed replicas.",
    )
    prefill: PrefillTargets = Field(default_factory=PrefillTargets)
    decode: DecodeTargets = Field(default_factory=DecodeTargets)
    ratio: RatioSpec = Field(default_factory=RatioSpec)
    scale_down_below: float = Field(
        default=0.5,
        gt=0,
        lt=1,
        description="Hysteresis: a role scales down only while every signal is below this share of its target "
        "(and scales up once any is above it); in between it holds.",
    )
    upscale_delay_s: float = Field(
        default=0, ge=0, description="How long a role must stay over a target before it scales up (fast: 0)."
    )
    downscale_delay_s: float = Field(
        default=120,
        ge=0,
        description="How long a role must stay below its targets (and since its last scale-up) before it "
        "scales down, one replica at a time (slow).",
    )
    placement_timeout_s: float = Field(
        default=300,
        gt=0,
        description="A role whose target replicas have not all started within this long is 'not reachable' (its "
        "pool cannot place more): the policy stops raising it and reports it (ray_rld_role_target_unreachable).",
    )
    look_back_period_s: float = Field(
        default=30,
        gt=10,
        description="Window over which Ray Serve averages each replica's reported signals (the roles' "
        "autoscaling_config.look_back_period_s); Ray 2.58 wants it above its metrics_interval_s (10 s).",
    )
    log_every_s: float = Field(
        default=60, gt=0, description="A decision that changes nothing is logged at most this often."
    )

    @field_validator("mode", mode="before")
    @classmethod
    def _yaml_off(cls, value: Any) -> Any:
        return "off" if value is False else value  # an unquoted `off` in YAML 1.1 (Helm's values) is false


class AppConfig(StrictModel):
    """The whole serve app: one model, served aggregated or disaggregated."""

    mode: Literal["disaggregated", "aggregated"] = "disaggregated"
    model: ModelSpec
    accelerator: Literal["gpu", "cpu"] = "gpu"
    prefill: Optional[RoleSpec] = None
    decode: RoleSpec = Field(description="In aggregated mode this role serves whole requests.")
    kv_transfer: KVTransferSpec = Field(default_factory=KVTransferSpec)
    placement: PlacementSpec = Field(default_factory=PlacementSpec)
    frontend: FrontendSpec = Field(default_factory=FrontendSpec)
    engine_env: dict[str, str] = Field(
        default_factory=dict, description="Env vars for every engine role; a role's own `engine_env` wins."
    )
    timeouts: TimeoutSpec = Field(default_factory=TimeoutSpec)
    streaming: StreamingSpec = Field(default_factory=StreamingSpec)
    engine_metrics: bool = Field(
        default=True,
        description="Export vLLM's engine metrics (vllm:*) through Ray's metrics agent (LLMConfig.log_engine_metrics).",
    )
    remote_prefill_min_tokens: int = Field(
        default=0,
        ge=0,
        description="Selective disaggregation: prompts shorter than this many tokens are "
        "prefilled locally by decode (no KV transfer). 0 sends every prompt to prefill.",
    )
    auth: AuthSpec = Field(default_factory=AuthSpec)
    limits: LimitsSpec = Field(default_factory=LimitsSpec)
    admission: AdmissionSpec = Field(default_factory=AdmissionSpec)
    failover: FailoverSpec = Field(default_factory=FailoverSpec)
    containment: ContainmentSpec = Field(default_factory=ContainmentSpec)
    overflow: OverflowSpec = Field(default_factory=OverflowSpec)
    autoscaling: CoupledAutoscalingSpec = Field(default_factory=CoupledAutoscalingSpec)

    @model_validator(mode="after")
    def _check_autoscaling_mode(self) -> "AppConfig":
        mode = self.autoscaling.mode
        if mode == "coupled":
            if self.mode != "disaggregated":
                raise ValueError(
                    "autoscaling.mode: coupled scales prefill and decode together and needs mode disaggregated; "
                    "with one role use perDeployment"
                )
            for role, spec in self.roles().items():
                if not spec.autoscaled:
                    raise ValueError(
                        f"{role}.autoscaling.enabled: autoscaling.mode coupled scales both roles; enable "
                        f"{role}.autoscaling (its min_replicas/max_replicas are the policy's bounds for {role})"
                    )
                assert spec.autoscaling is not None
                if spec.autoscaling.min_replicas < 1:
                    raise ValueError(
                        f"{role}.autoscaling.min_replicas: must be >= 1 with autoscaling.mode coupled; the policy "
                        f"scales on what running engines report, and a role at 0 replicas reports nothing"
                    )
            self._check_ratio_reachable()
        elif mode == "off":
            for role, spec in self.roles().items():
                if spec.autoscaled:
                    raise ValueError(
                        f"{role}.autoscaling.enabled: true conflicts with autoscaling.mode off; set it false "
                        f"(the role runs {role}.replicas) or use autoscaling.mode perDeployment or coupled"
                    )
        return self

    def _check_ratio_reachable(self) -> None:
        assert self.prefill is not None and self.prefill.autoscaling and self.decode.autoscaling
        p, d, ratio = self.prefill.autoscaling, self.decode.autoscaling, self.autoscaling.ratio
        if ratio.max is not None and p.min_replicas > ratio.max * d.max_replicas:
            raise ValueError(
                f"autoscaling.ratio.max ({ratio.max}): prefill.autoscaling.min_replicas ({p.min_replicas}) over "
                f"decode.autoscaling.max_replicas ({d.max_replicas}) is already above it; no replica counts "
                "within the bounds satisfy it"
            )
        if ratio.min is not None and p.max_replicas < ratio.min * max(d.min_replicas, 1):
            raise ValueError(
                f"autoscaling.ratio.min ({ratio.min}): prefill.autoscaling.max_replicas ({p.max_replicas}) over "
                f"decode.autoscaling.min_replicas ({max(d.min_replicas, 1)}) is already below it; no replica "
                "counts within the bounds satisfy it"
            )

    def app_autoscaling_policy(self) -> Optional[dict[str, Any]]:
        """serveConfigV2 `applications[].autoscaling_policy` for this app (coupled mode), else None. The chart
        renders the same (tests/autoscaling checks that they agree)."""
        if self.autoscaling.mode != "coupled":
            return None
        return {
            "policy_function": COUPLED_POLICY_FUNCTION,
            "policy_kwargs": {"autoscaling": self.autoscaling.model_dump(mode="json")},
        }

    @model_validator(mode="after")
    def _check_admission_fits_frontend(self) -> "AppConfig":
        # Serve queues (unbounded, in the proxy) whatever exceeds max_ongoing_requests before the frontend
        # ever sees it; the admission queue only bounds anything if it fits under that limit.
        in_flight, queued = self.admission_limits()
        wanted = in_flight + queued + (self.overflow.max_in_flight if self.overflow.enabled else 0)
        if wanted > self.frontend.max_ongoing_requests:
            raise ValueError(
                f"admission.max_in_flight + admission.max_queued (+ overflow.max_in_flight when enabled) = {wanted} > "
                f"frontend.max_ongoing_requests ({self.frontend.max_ongoing_requests}): Serve would queue the rest "
                "without bound before admission control sees it; raise frontend.max_ongoing_requests"
            )
        return self

    def admission_limits(self) -> tuple[int, int]:
        """(max_in_flight, max_queued) per frontend replica, defaults filled in."""
        room = self.frontend.max_ongoing_requests - (self.overflow.max_in_flight if self.overflow.enabled else 0)
        queued_set = self.admission.max_queued
        if self.admission.max_in_flight:
            in_flight = self.admission.max_in_flight
        elif queued_set is not None:  # the rest of the room runs (e.g. max_queued 0: no queue, all of it runs)
            in_flight = max(1, room - queued_set)
        else:
            in_flight = max(1, room // 2)
        queued = queued_set if queued_set is not None else max(0, room - in_flight)
        return in_flight, queued

    def max_model_len(self) -> Optional[int]:
        """The context length if the config sets it (decode's engine_args.max_model_len), else None."""
        value = self.decode.engine_args.get("max_model_len")
        return int(value) if isinstance(value, int) else None

    @model_validator(mode="after")
    def _check_accelerator(self) -> "AppConfig":
        if self.accelerator == "cpu":
            for role, spec in self.roles().items():
                if spec.accelerator_type is not None:
                    raise ValueError(
                        f"{role}.accelerator_type ({spec.accelerator_type}): only valid with accelerator gpu; "
                        "remove it for CPU engines"
                    )
                if spec.gpu_fraction != 1:
                    raise ValueError(f"{role}.gpu_fraction ({spec.gpu_fraction}): only valid with accelerator gpu")
            if self.mode == "disaggregated" and self.kv_transfer.buffer_device != "cpu":
                raise ValueError("kv_transfer.buffer_device: must be cpu when accelerator is cpu")
        return self

    @model_validator(mode="after")
    def _check_topology(self) -> "AppConfig":
        if self.mode == "aggregated":
            return self
        if self.prefill is None:
            raise ValueError("prefill: required when mode is disaggregated")
        p, d = self.prefill, self.decode
        if d.pipeline_parallel_size > 1:
            raise ValueError(
                "decode.pipeline_parallel_size: must be 1; vLLM's NIXL KV transfer does not "
                "support pipeline parallelism on the decode side"
            )
        if p.pipeline_parallel_size > 1 and self.kv_transfer.connector != "NixlPushConnector":
            raise ValueError(
                "prefill.pipeline_parallel_size: > 1 needs kv_transfer.connector NixlPushConnector; "
                "NixlConnector (pull) rejects PP > 1 at its handshake"
            )
        if (
            p.tensor_parallel_size > d.tensor_parallel_size
            and not self.kv_transfer.allow_prefill_tp_greater_than_decode
        ):
            raise ValueError(
                f"prefill.tensor_parallel_size ({p.tensor_parallel_size}) > decode.tensor_parallel_size "
                f"({d.tensor_parallel_size}): NIXL transfers need prefill TP <= decode TP; set "
                "kv_transfer.allow_prefill_tp_greater_than_decode if your vLLM supports it"
            )
        if self.kv_transfer.connector == "NixlPushConnector":
            for role, spec in (("prefill", p), ("decode", d)):
                if spec.side_channel_port is None:
                    raise ValueError(
                        f"{role}.side_channel_port: required with NixlPushConnector (Ray 2.58 does "
                        "not assign NIXL side-channel ports for it; engines would clash on 5600)"
                    )
        return self

    def roles(self) -> dict[str, RoleSpec]:
        """The engine roles this mode deploys, by name (disaggregated: prefill first, when set)."""
        if self.mode == "aggregated" or self.prefill is None:
            return {"decode": self.decode}
        return {"prefill": self.prefill, "decode": self.decode}

    # ---- live values (Serve's user_config) ----

    def deployment_names(self) -> list[str]:
        """The Serve deployments `build_app` makes for this config (frontend first when it has its own)."""
        model = self.model.id.replace("/", "--").replace(".", "_")
        roles = ["aggregated"] if self.mode == "aggregated" else ["prefill", "decode"]
        names = [ENGINE_DEPLOYMENT_PREFIX[role] + model for role in roles]
        return names if self.frontend.direct_streaming else [FRONTEND_DEPLOYMENT, *names]

    def live(self) -> dict[str, Any]:
        """The live fields (LIVE_FIELDS) as JSON: every deployment's `user_config`."""
        fields = set(LIVE_FIELDS) - ({"remote_prefill_min_tokens"} if self.mode == "aggregated" else set())
        return self.model_dump(mode="json", include=fields)

    def static_args(self) -> dict[str, Any]:
        """The args without the live fields (JSON): what the chart passes as `applications[].args`."""
        return self.model_dump(mode="json", exclude=set(LIVE_FIELDS))

    def serve_deployments(self) -> list[dict[str, Any]]:
        """serveConfigV2 `applications[].deployments`: each deployment's user_config is the live fields. The
        chart renders the same (tests/chart checks that they agree)."""
        live = self.live()
        return [{"name": name, "user_config": live} for name in self.deployment_names()]

    def with_live(self, user_config: Optional[Mapping[str, Any]]) -> "AppConfig":
        """This config with a deployment's user_config applied: each live field it sets replaces this one's
        (a field it leaves out keeps this config's value: the args' at the first call, the value in force
        after). Raises LiveConfigError naming the bad key."""
        live = parse_live(user_config)
        if not live.model_fields_set:
            return self
        merged = {**self.model_dump(), **live.model_dump(include=live.model_fields_set)}
        try:
            return AppConfig.model_validate(merged)
        except ValidationError as exc:
            raise LiveConfigError(f"{LIVE_WHERE} conflicts with the app's args:\n{exc}") from exc


LIVE_WHERE = (
    "serve_app: invalid user_config (serveConfigV2 applications[].deployments[].user_config; chart values "
    "remotePrefillMinTokens, timeouts, limits)"
)

LiveConfig = create_model(  # the live fields, with AppConfig's own types, defaults and rules
    "LiveConfig",
    __base__=StrictModel,
    **{name: (AppConfig.model_fields[name].annotation, AppConfig.model_fields[name]) for name in LIVE_FIELDS},
)


class LiveConfigError(ValueError):
    """A deployment's user_config is not a valid set of live values."""


def parse_live(user_config: Optional[Mapping[str, Any]]) -> BaseModel:
    """A user_config validated as LiveConfig (unknown keys refused); raises LiveConfigError naming the key."""
    if user_config is None:
        user_config = {}
    if not isinstance(user_config, Mapping):
        raise LiveConfigError(f"{LIVE_WHERE}: expected a mapping of {', '.join(LIVE_FIELDS)}, got {type(user_config).__name__}")
    try:
        return LiveConfig.model_validate(dict(user_config))
    except ValidationError as exc:
        raise LiveConfigError(f"{LIVE_WHERE}:\n{exc}") from exc
