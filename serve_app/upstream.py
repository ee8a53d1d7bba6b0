"""The one door to upstream internals: every private name of Ray Serve LLM, Ray Serve and vLLM the app uses.

Ray Serve LLM's building blocks (its P/D servers, OpenAI ingress, batcher, KV-connector backends) live under
`ray.llm._internal`, which moves between Ray releases; vLLM's NIXL worker and serving classes likewise. The app
imports none of those modules itself: it imports names from here, and it calls or overrides private members
only as listed in `MEMBERS`. Bumping Ray or vLLM is then a change to this file:

  NAMES     name -> (module, attribute, what for). `from serve_app.upstream import X` imports only X's module,
            on first use (vLLM imports `serve_app.engine.nixl` in every engine process; that must not pull
            Ray Serve LLM's ingress in). A name that is gone raises ImportError naming it, its old home and
            the installed Ray/vLLM.
  MEMBERS   (owner, member, how): members of upstream classes the app relies on. `override`: a hook Ray
            calls that our subclass replaces (if Ray renames it, our override silently stops running);
            `call`: a method or class attribute we call; `attr`: an instance attribute its constructor
            sets, which we read.

tests/unit/test_upstream.py resolves every name and member against the installed versions and fails naming
the symbol; it also fails when a serve_app class overrides an upstream method that is not listed here.
"""

from __future__ import annotations

import importlib
from typing import Any, NamedTuple


class Name(NamedTuple):
    module: str
    attr: str | None  # None: the module itself
    why: str


_INGRESS = "ray.llm._internal.serve.core.ingress"
_API_MODELS = "ray.llm._internal.serve.core.configs.openai_api_models"
_PD = "ray.llm._internal.serve.serving_patterns.prefill_decode"
_NIXL = "vllm.distributed.kv_transfer.kv_connector.v1.nixl"

NAMES: dict[str, Name] = {
    # --- Ray Serve LLM: request/response models (OpenAI protocol, Ray's wrappers of vLLM's) ---
    "ChatCompletionRequest": Name(_API_MODELS, "ChatCompletionRequest", "request types"),
    "CompletionRequest": Name(_API_MODELS, "CompletionRequest", "request types"),
    "CompletionResponse": Name(_API_MODELS, "CompletionResponse", "tests: response shape"),
    "ErrorInfo": Name(_API_MODELS, "ErrorInfo", "OpenAI-shaped errors"),
    "ErrorResponse": Name(_API_MODELS, "ErrorResponse", "errors the engines yield"),
    "ModelCard": Name(_API_MODELS, "ModelCard", "tests: /v1/models"),
    "OpenAIHTTPException": Name(_API_MODELS, "OpenAIHTTPException", "frontend error handler"),
    "to_model_metadata": Name(_API_MODELS, "to_model_metadata", "model cards of /v1/models"),
    "RawRequestInfo": Name("ray.llm._internal.serve.core.protocol", "RawRequestInfo", "raw request to engines"),
    # --- Ray Serve LLM: OpenAI ingress ---
    "OpenAiIngress": Name(f"{_INGRESS}.ingress", "OpenAiIngress", "base of BoundedOpenAiIngress"),
    "make_fastapi_ingress": Name(f"{_INGRESS}.ingress", "make_fastapi_ingress", "the frontend deployment class"),
    "DEFAULT_ENDPOINTS": Name(f"{_INGRESS}.ingress", "DEFAULT_ENDPOINTS", "route decorators we reuse"),
    "SetRequestIdMiddleware": Name(f"{_INGRESS}.middleware", "SetRequestIdMiddleware", "x-request-id"),
    "NON_STREAMING_RESPONSE_TYPES": Name(f"{_INGRESS}.utils", "NON_STREAMING_RESPONSE_TYPES", "JSON vs SSE"),
    "peek_at_generator": Name(f"{_INGRESS}.utils", "_peek_at_generator", "first chunk decides the response"),
    "openai_json_wrapper": Name(f"{_INGRESS}.utils", "_openai_json_wrapper", "chunks -> SSE lines"),
    "sanitize_chat_completion_request": Name(
        f"{_INGRESS}.utils", "_sanitize_chat_completion_request", "what Ray does to chat bodies"
    ),
    "add_http_metrics_middleware": Name(
        "ray.llm._internal.serve.observability.metrics.fast_api_metrics", "add_http_metrics_middleware",
        "Ray's HTTP metrics on our app",
    ),
    "metrics_lifespan": Name(
        "ray.llm._internal.serve.observability.metrics.fast_api_metrics", "metrics_lifespan",
        "Ray's HTTP metrics on our app",
    ),
    # --- Ray Serve LLM: servers and builders ---
    "LLMServer": Name("ray.llm._internal.serve.core.server.llm_server", "LLMServer", "aggregated engine server"),
    "build_llm_deployment": Name(
        "ray.llm._internal.serve.core.server.builder", "build_llm_deployment", "engine deployments"
    ),
    "maybe_apply_llm_deployment_config_defaults": Name(
        "ray.llm._internal.common.dict_utils", "maybe_apply_llm_deployment_config_defaults", "ingress options"
    ),
    "PDServingArgs": Name(f"{_PD}.builder", "PDServingArgs", "P/D args validation"),
    "PDOrchestratorMixin": Name(f"{_PD}.pd_server", "PDOrchestratorMixin", "P/D hand-off (members below)"),
    "PDDecodeServer": Name(f"{_PD}.pd_server", "PDDecodeServer", "base of SelectiveDecodeServer"),
    "PDPrefillServer": Name(f"{_PD}.pd_server", "PDPrefillServer", "base of MeteredPrefillServer"),
    "BaseConnectorBackend": Name(
        "ray.llm._internal.serve.engines.vllm.kv_transfer.base", "BaseConnectorBackend", "KV hand-off steps"
    ),
    "VLLMEngine": Name("ray.llm._internal.serve.engines.vllm.vllm_engine", "VLLMEngine", "LLMServer.engine"),
    "Batcher": Name("ray.llm._internal.serve.utils.batcher", "Batcher", "base of StreamBatcher"),
    "get_logger": Name("ray.llm._internal.serve.observability.logging", "get_logger", "Ray's LLM log format"),
    "get_serve_request_id": Name("ray.llm._internal.serve.utils.server_utils", "get_serve_request_id", "logs"),
    "reuse_prompt_token_ids": Name(
        "ray.llm._internal.common.patches.vllm.tokenize_once", "reuse_prompt_token_ids",
        "decode skips re-tokenizing the prompt prefill tokenized",
    ),
    # --- Ray Serve ---
    "session_id_from_headers": Name("ray.serve._private.http_util", "session_id_from_headers", "routing"),
    "get_global_client": Name("ray.serve.context", "_get_global_client", "role watch: the controller's client"),
    "ServeControllerClient": Name("ray.serve._private.client", "ServeControllerClient", "role watch (member below)"),
    "validate_http_proxy_callback_return": Name(
        "ray.serve._private.http_util", "validate_http_proxy_callback_return", "tests: proxy middlewares"
    ),
    "import_attr": Name("ray._common.utils", "import_attr", "tests: how Serve loads a callback path"),
    "serve_private_api": Name("ray.serve._private.api", None, "devstack: serve_start with the stack's HTTP port"),
    "maybe_enable_token_auth": Name(
        "ray._private.authentication.authentication_token_setup", "maybe_enable_token_auth_if_token_available",
        "tests: whether a Ray process turns token auth on (devstack's loopback stack must not)",
    ),
    # --- vLLM ---
    "EngineDeadError": Name("vllm.v1.engine.exceptions", "EngineDeadError", "containment"),
    "VLLMClientError": Name(
        "vllm.exceptions", "VLLMClientError", "vLLM's 4xx errors (VLLMValidationError...): no ValueErrors since 0.29"
    ),
    "OpenAIServingChat": Name(
        "vllm.entrypoints.openai.chat_completion.serving", "OpenAIServingChat", "prompt token count (chat)"
    ),
    "OpenAIServingCompletion": Name(
        "vllm.entrypoints.openai.completion.serving", "OpenAIServingCompletion", "prompt token count"
    ),
    "NixlConnector": Name(f"{_NIXL}.connector", "NixlConnector", "re-exported by serve_app.engine.nixl"),
    "NixlPushConnector": Name(f"{_NIXL}.connector", "NixlPushConnector", "re-exported by serve_app.engine.nixl"),
    "nixl_base_worker": Name(f"{_NIXL}.base_worker", None, "its nixl_agent_config (UCX progress thread off)"),
    "nixl_connector_module": Name(f"{_NIXL}.connector", None, "tests: connector internals"),
    "vllm_envs": Name("vllm.envs", None, "the serving process settles: vLLM's env cache"),
    "StatLoggerBase": Name("vllm.v1.metrics.loggers", "StatLoggerBase", "base of the autoscaling EngineSignals"),
    "StatLoggerManager": Name("vllm.v1.metrics.loggers", "StatLoggerManager", "tests: signals through vLLM's loggers"),
    "IterationStats": Name("vllm.v1.metrics.stats", "IterationStats", "tests: engine stats fed to EngineSignals"),
    "SchedulerStats": Name("vllm.v1.metrics.stats", "SchedulerStats", "tests: engine stats fed to EngineSignals"),
    # --- Ray Serve autoscaling internals (tests: the policy inside Serve's own wrapper) ---
    "resolve_policy_callable": Name(
        "ray.serve._private.autoscaling_state", "_resolve_policy_callable", "tests: how Serve loads the policy"
    ),
    "DeploymentID": Name("ray.serve._private.common", "DeploymentID", "tests: autoscaling contexts"),
    "ReplicaID": Name("ray.serve._private.common", "ReplicaID", "tests: autoscaling contexts"),
    # Ray Serve: the replica's log file, set up again after a library's logging.config closed it (telemetry.logs)
    "configure_component_logger": Name(
        "ray.serve._private.logging_utils", "configure_component_logger", "replica log file, set up again"
    ),
    "ServeComponentType": Name("ray.serve._private.common", "ServeComponentType", "replica log file"),
    "RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE": Name(
        "ray.serve._private.constants", "RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE", "replica log file"
    ),
    "LoggingConfig": Name("ray.serve.schema", "LoggingConfig", "replica log file"),
    "get_internal_replica_context": Name("ray.serve.context", "_get_internal_replica_context", "replica log file"),
    "ReplicaContext": Name("ray.serve.context", "ReplicaContext", "replica log file (members below)"),
    # torch: CPU engines ask for AMX in each vLLM worker (serve_app.engine.cpu)
    "is_amx_tile_supported": Name("torch.cpu", "_is_amx_tile_supported", "does the CPU advertise AMX"),
    "init_amx": Name("torch.cpu", "_init_amx", "arch_prctl(ARCH_REQ_XCOMP_PERM) for AMX in this process"),
    # Ray Serve: the FastAPI app of an ingress replica (its live limits, BoundedOpenAiIngress.reconfigure)
    "serve_build_app": Name("ray.serve._private.build_app", "build_app", "tests: the deployments an app builds"),
    "ASGIAppReplicaWrapper": Name("ray.serve._private.http_util", "ASGIAppReplicaWrapper", "an ingress replica's app"),
    "ray_worker": Name("ray._private.worker", None, "tests: the Ray node's log rotation, read by Serve's logger"),
    # Ray core: a worker pod's preStop drains its node (serve_app.pod.drain), as `ray drain-node` does
    "InnerGcsClient": Name("ray._raylet", "InnerGcsClient", "pod drain: GCS calls with a connect timeout (members below)"),
    "DrainNodeReason": Name("ray.core.generated.autoscaler_pb2", "DrainNodeReason", "pod drain: the reason"),
    "canonicalize_bootstrap_address": Name(
        "ray._private.services", "canonicalize_bootstrap_address", "pod drain: GCS address (env, ray_current_cluster)"
    ),
}


class Member(NamedTuple):
    owner: str  # a key of NAMES
    name: str
    how: str  # "override" | "call" | "attr"


MEMBERS: tuple[Member, ...] = (
    # Ray's GCS client (what GcsClient wraps; `standalone` takes a connect timeout): a worker pod's preStop drains its node
    Member("InnerGcsClient", "standalone", "call"),
    Member("InnerGcsClient", "get_all_node_info", "call"),
    Member("InnerGcsClient", "drain_node", "call"),
    # the role watch reads the controller's details dict itself (serve.status() rebuilds pydantic models from it)
    Member("ServeControllerClient", "get_serve_details", "call"),
    # LLMServer: our metered servers
    Member("LLMServer", "__serve_build_asgi_app__", "override"),  # direct streaming's ASGI app
    Member("LLMServer", "_batch_output_stream", "override"),  # StreamBatcher: first chunk at once
    Member("LLMServer", "_get_batch_interval_ms", "call"),
    Member("LLMServer", "chat", "override"),
    Member("LLMServer", "completions", "override"),
    Member("LLMServer", "_llm_config", "attr"),
    Member("LLMServer", "engine", "attr"),
    # Ray's vLLM engine (LLMServer.engine)
    Member("VLLMEngine", "_engine_client", "attr"),  # .errored: refuse before dispatch
    Member("VLLMEngine", "_oai_serving_chat", "attr"),
    Member("VLLMEngine", "_oai_serving_completion", "attr"),
    # vLLM serving objects: selective disaggregation counts prompt tokens with the engine's renderers
    Member("OpenAIServingChat", "render_chat_request", "call"),
    Member("OpenAIServingCompletion", "render_completion_request", "call"),
    Member("OpenAIServingChat", "_extract_prompt_len", "call"),
    Member("OpenAIServingCompletion", "_extract_prompt_len", "call"),
    # the P/D orchestration (PrefillFailover runs Ray's hand-off steps itself)
    Member("PDDecodeServer", "_get_connector_backend", "override"),
    Member("PDDecodeServer", "_maybe_prewarm", "override"),
    Member("PDDecodeServer", "_pd_handle_request", "call"),
    Member("PDDecodeServer", "_decode_reuse_ids", "call"),
    Member("PDDecodeServer", "_request_prefill_token_ids", "call"),
    Member("PDDecodeServer", "_prefill_handle", "attr"),
    Member("BaseConnectorBackend", "requires_peer_binding", "call"),
    Member("BaseConnectorBackend", "concurrent_handoff", "call"),
    Member("BaseConnectorBackend", "prepare_prefill_request", "call"),
    Member("BaseConnectorBackend", "prepare_decode_request", "call"),
    # OpenAiIngress: BoundedOpenAiIngress
    Member("OpenAiIngress", "_process_llm_request", "override"),
    Member("OpenAiIngress", "_get_response", "override"),
    Member("OpenAiIngress", "chat", "override"),
    Member("OpenAiIngress", "completions", "override"),
    Member("OpenAiIngress", "_get_model_id", "call"),
    Member("OpenAiIngress", "_get_configured_serve_handle", "call"),
    # Serve's ingress wrapper: the app whose live limits BoundedOpenAiIngress.reconfigure replaces
    Member("ASGIAppReplicaWrapper", "app", "call"),
    # the replica context: which log file Serve set up (telemetry.logs)
    Member("ReplicaContext", "replica_id", "attr"),
    Member("ReplicaContext", "_deployment_config", "attr"),
    # Batcher: StreamBatcher
    Member("Batcher", "read", "override"),
    Member("Batcher", "stream", "override"),
    Member("Batcher", "check_done_and_drain", "override"),
    Member("Batcher", "_merge_results", "override"),
    Member("Batcher", "generator", "attr"),
    Member("Batcher", "queue", "attr"),
    Member("Batcher", "done_event", "attr"),
    Member("Batcher", "interval_s", "attr"),
    Member("Batcher", "read_task", "attr"),
    # vLLM's NIXL worker module
    Member("nixl_base_worker", "nixl_agent_config", "call"),
    # vLLM's stat loggers: EngineSignals (serve_app/autoscaling/signals.py)
    Member("StatLoggerBase", "record", "override"),
    Member("StatLoggerBase", "log_engine_initialized", "override"),
    Member("vllm_envs", "enable_envs_cache", "call"),
)


def versions() -> str:
    found = []
    for dist in ("ray", "vllm"):
        try:
            found.append(f"{dist} {importlib.import_module(dist).__version__}")
        except Exception:  # noqa: BLE001 - only for the message
            found.append(f"{dist} ?")
    return ", ".join(found)


def resolve(name: str) -> Any:
    """The upstream object `name` stands for; ImportError naming it and where it was expected."""
    spec = NAMES[name]
    where = spec.module + (f".{spec.attr}" if spec.attr else "")
    try:
        module = importlib.import_module(spec.module)
    except ImportError as exc:
        raise ImportError(
            f"serve_app.upstream: {name!r} ({spec.why}) is expected at {where}, but module {spec.module} does "
            f"not import with {versions()}: {exc}. Upstream moved it: update NAMES in serve_app/upstream.py."
        ) from exc
    if spec.attr is None:
        return module
    try:
        return getattr(module, spec.attr)
    except AttributeError as exc:
        raise ImportError(
            f"serve_app.upstream: {name!r} ({spec.why}) is expected at {where}, but {spec.module} has no "
            f"{spec.attr!r} with {versions()}. Upstream moved or renamed it: update NAMES in serve_app/upstream.py."
        ) from exc


def __getattr__(name: str) -> Any:  # PEP 562: `from serve_app.upstream import X` resolves X on first use
    if name not in NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r} (not in serve_app.upstream.NAMES)")
    value = resolve(name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(NAMES))

