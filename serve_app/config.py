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

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

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
    tokenize_once: bool = Field(
        default=True,
        description="Decode reuses the prompt token ids prefill returns instead of rendering and "
        "tokenizing the prompt again.",
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
    num_cpus: float = Field(default=1, ge=0)
    max_ongoing_requests: int = Field(default=1000, ge=1)


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


class AuthSpec(StrictModel):
    """API keys clients must send as `Authorization: Bearer <key>`. Auth is on when either source is set.

    Keys never appear in the config itself: they come from a file (a mounted Kubernetes Secret, one key
    per line) and/or an env var. (Field set of the shared contract; enforced by serve_app's auth layer.)
    """

    api_keys_file: Optional[str] = Field(
        default=None, description="File with one API key per line (blank lines and # comments ignored)."
    )
    api_keys_env: Optional[str] = Field(
        default=None, description="Name of an env var holding API keys, separated by commas or newlines."
    )

    @property
    def enabled(self) -> bool:
        return bool(self.api_keys_file or self.api_keys_env)

class StreamingSpec(StrictModel):
    """How the serving replica batches streamed chunks into Serve messages (serve_app/hops.py)."""

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
