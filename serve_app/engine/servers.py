"""The engine replicas: Ray Serve LLM's servers plus per-request metrics and selective disaggregation.

- `MeteredPrefillServer` is Ray's `PDPrefillServer` timing its own work (role=prefill).
- `SelectiveDecodeServer` is Ray's `PDDecodeServer` (decode engine + prefill orchestration) that first
  counts the prompt's tokens with its own engine's tokenizer: prompts shorter than
  `remote_prefill_min_tokens` are prefilled locally, without any kv_transfer_params, and only the
  rest go through the remote-prefill hand-off, run by `serve_app.engine.failover.PrefillFailover` (deadlines,
  a retry on another prefill replica, local fallback).
- `MeteredServer` is Ray's plain `LLMServer`, for aggregated mode.
- `Direct*` are the two serving classes with `frontend.direct_streaming`: they serve HTTP themselves
  (serve_app/engine/direct.py).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator, Callable, Optional, Union

from ray.serve.handle import DeploymentHandle
from ray.serve.llm import LLMConfig

from serve_app.autoscaling import signals as engine_signals
from serve_app.autoscaling.signals import EngineSignals
from serve_app.upstream import (
    Batcher,
    ChatCompletionRequest,
    CompletionRequest,
    ErrorInfo,
    ErrorResponse,
    LLMServer,
    PDDecodeServer,
    PDPrefillServer,
    RawRequestInfo,
    VLLMClientError,
    get_logger,
)
from serve_app.telemetry import hops
from serve_app.engine.batching import StreamBatcher, StreamLoad, stamp_first
from serve_app.telemetry.hops import HopClock
from serve_app.telemetry.logs import keep_replica_log
from serve_app.llm_configs import (
    FIRST_CHUNK_IMMEDIATELY,
    PREWARM,
    PREWARM_TIMEOUT_S,
    STREAM_MAX_INTERVAL_MS,
    STREAM_MAX_MESSAGES_PER_S,
)
from serve_app.config import FailoverSpec, KVTransferSpec, parse_live
from serve_app.engine.direct import DirectIngressMixin
from serve_app.engine.failover import PrefillFailover
from serve_app.frontend.containment import EngineDeadBeforeDispatch
from serve_app.telemetry.metrics import Path, RequestMetrics

logger = get_logger(__name__)

Request = Union[ChatCompletionRequest, CompletionRequest]


def settle_serving_process() -> None:
    """Once the engine is up: what vLLM's own processes do after start-up, which Ray's engine replica does not.

    - vLLM's env cache (`vllm.envs.enable_envs_cache`, which vLLM's engine core and workers turn on): without it
      every engine output re-reads env vars through os.getenv (IterationStats reads VLLM_COMPUTE_NANS_IN_LOGITS
      per request output): 5 % of the serving replica's CPU at 1k-1k, 24 req/s on an H200
      (bench/results/2026-12-02-h200-saturation). Env vars do not change after a replica starts.
    - The start-up heap frozen out of the garbage collector (`gc.freeze`, as vLLM's API server does): a replica
      holds Ray, vLLM, torch and the tokenizer; full collections triggered by per-token allocations would scan
      all of it, pausing every stream of the replica.
    """
    import gc

    try:
        from serve_app.upstream import vllm_envs as envs

        envs.enable_envs_cache()
    except (ImportError, AttributeError):  # another vLLM: nothing to turn on
        pass
    gc.collect()
    gc.freeze()


def refuse_if_engine_dead(server: Any) -> None:
    """Before a request touches the engine: an engine that is already dead raises EngineDeadBeforeDispatch,
    so the frontend and the prefill failover know the request did not kill it (it may go elsewhere), unlike
    vLLM's EngineDeadError while it runs (containment: serve_app/frontend/containment.py)."""
    client = getattr(getattr(server, "engine", None), "_engine_client", None)
    if client is not None and getattr(client, "errored", False) is True:
        raise EngineDeadBeforeDispatch("this replica's vLLM engine was already dead; Serve is restarting it")


def out_of_vocab(server: Any, request: Any) -> Optional[str]:
    """Why a completions prompt of token ids cannot run on this engine's model, or None.

    vLLM 0.29 checks ids against max(highest tokenizer id, tokenizer.vocab_size), one past the last id when the
    two agree, and the engine then reads its embedding table out of bounds: the resilience fuzz killed both
    decode engines with `"prompt": [65, 260, 181, 2048, 138]` on the 2048-token test model (2026-12-06). Ids are
    checked here against the model's vocabulary before the engine sees them."""
    if not isinstance(request, CompletionRequest) or not isinstance(request.prompt, list):
        return None
    ids: list[int] = []
    for item in request.prompt:
        if isinstance(item, int):
            ids.append(item)
        elif isinstance(item, list):
            ids.extend(i for i in item if isinstance(i, int))
    if not ids:
        return None
    model_config = getattr(getattr(getattr(server, "engine", None), "_engine_client", None), "model_config", None)
    try:
        vocab = int(model_config.get_vocab_size())
    except Exception:  # noqa: BLE001 - no engine yet (or another engine): vLLM's own check stands
        return None
    bad = next((i for i in ids if i < 0 or i >= vocab), None)
    if bad is None:
        return None
    return f"Token id {bad} is out of vocabulary: this model's token ids are 0 to {vocab - 1}."


async def client_error(message: str, param: str):
    """The engine's answer to a request it refuses before running it: one 400 error chunk, as vLLM's own
    validation errors reach the frontend (which keeps the status, message and param)."""
    yield ErrorResponse(error=ErrorInfo(message=message, type="BadRequestError", param=param, code=400))


class _MeteredMixin:
    """Per-request metrics for an LLMServer subclass (labels: this replica's mode and role)."""

    _metrics: RequestMetrics
    _engine_signals: Optional[EngineSignals] = None
    _engine_signals_tried: bool = False

    def _init_metrics(self, llm_config: LLMConfig, *, mode: str, role: str) -> None:
        self._metrics = RequestMetrics(model=llm_config.model_id, mode=mode, role=role)

    def reconfigure(self, user_config: Optional[dict[str, Any]]) -> None:
        """Serve's user_config: the app's live values (config.LIVE_FIELDS), validated. An engine that reads
        none of them (prefill, aggregated) only checks them, so every deployment of the app takes the same
        user_config and refuses the same mistakes."""
        parse_live(user_config)

    async def record_autoscaling_stats(self) -> dict[str, float]:
        """Ray Serve's custom autoscaling metrics hook (called for autoscaled deployments): this replica's engine
        signals for the coupled policy (serve_app/autoscaling/signals.py); {} until the engine runs."""
        client = getattr(getattr(self, "engine", None), "_engine_client", None)
        if client is None:
            return {}
        if not self._engine_signals_tried:
            self._engine_signals_tried = True
            self._engine_signals = engine_signals.attach(client)
        if self._engine_signals is None:
            return {}
        return self._engine_signals.snapshot(idle=engine_signals.idle(client))

    def _metered(self, chunks: AsyncIterator[Any], request: Request, clock: HopClock, path: Path):
        return self._metrics.observe(chunks, clock, path=path, stream=bool(request.stream))

    def _batch_output_stream(self, generator: AsyncIterator[Any]):
        """Ray's hook for batching a streamed engine response: stamp the engine's first chunk on the
        request's clock, then batch with `StreamBatcher` (first chunk at once, the interval grown with this
        replica's open streams: `StreamLoad`) or Ray's `Batcher`."""
        llm_config: LLMConfig = self._llm_config
        clock = hops.CURRENT.get()
        interval_ms = self._get_batch_interval_ms()
        configs = llm_config.experimental_configs
        if configs.get(FIRST_CHUNK_IMMEDIATELY, True):
            load = getattr(self, "_stream_load", None)
            if load is None:
                load = self._stream_load = StreamLoad(
                    interval_ms or 0, configs.get(STREAM_MAX_INTERVAL_MS, interval_ms or 0),
                    configs.get(STREAM_MAX_MESSAGES_PER_S, 0))
            return StreamBatcher(generator, interval_ms=interval_ms, load=load, clock=clock).stream()
        stamped = stamp_first(generator, clock, called="engine_called", first="engine_first_chunk")
        return Batcher(stamped, interval_ms=interval_ms).stream()


class _OnePathMetered(_MeteredMixin):
    """Meters chat/completions of the next class in the MRO; every request of this server takes PATH."""

    MODE: str
    ROLE: str
    PATH: Path

    async def __init__(self, llm_config: LLMConfig, **kwargs):
        keep_replica_log()  # before the engine starts: NIXL's logging.config would close the replica's log file
        self._init_metrics(llm_config, mode=self.MODE, role=self.ROLE)
        await super().__init__(llm_config, **kwargs)
        settle_serving_process()

    async def chat(self, request: ChatCompletionRequest, raw_request_info: Optional[RawRequestInfo] = None):
        return await self._serve_metered(request, raw_request_info, super().chat)

    async def completions(self, request: CompletionRequest, raw_request_info: Optional[RawRequestInfo] = None):
        return await self._serve_metered(request, raw_request_info, super().completions)

    async def _serve_metered(self, request: Request, raw: Optional[RawRequestInfo], run: Callable):
        refuse_if_engine_dead(self)
        if (why := out_of_vocab(self, request)) is not None:
            return client_error(why, "prompt")
        clock = HopClock(path=self.PATH, mode=self.MODE)
        clock.stamp("replica_received")
        self._metrics.accepted(self.PATH)
        token = hops.CURRENT.set(clock)  # LLMServer builds the engine stream (and its batcher) in here
        try:
            chunks = await run(request, raw)
        finally:
            hops.CURRENT.reset(token)
        return self._metered(chunks, request, clock, self.PATH)


class MeteredServer(_OnePathMetered, LLMServer):
    """Aggregated mode: one engine serves whole requests (the AppConfig's decode role, local path)."""

    MODE, ROLE, PATH = "aggregated", "decode", "local"


class MeteredPrefillServer(_OnePathMetered, PDPrefillServer):
    """Prefill role of disaggregated mode: Ray's PDPrefillServer, timed."""

    MODE, ROLE, PATH = "disaggregated", "prefill", "remote"


class _HandoffClockBackend:
    """Delegates to Ray's KV-connector backend and stamps the request's clock at the two hand-off points.

    Ray's orchestrator calls `prepare_prefill_request` right before it sends the prefill request and
    `prepare_decode_request` right after the prefill response (with kv_transfer_params) arrives; both
    run while `hops.CURRENT` holds the request's clock (see `SelectiveDecodeServer._remote`).
    """

    def __init__(self, backend: Any) -> None:
        self._backend = backend

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def prepare_prefill_request(self, *, request: Request, peer: Any):
        clock = hops.CURRENT.get()
        if clock is not None:
            clock.stamp("prefill_sent")
        return self._backend.prepare_prefill_request(request=request, peer=peer)

    def prepare_decode_request(self, *, request: Request, peer: Any, prefill_response: Any):
        clock = hops.CURRENT.get()
        if clock is not None and prefill_response is not None:
            clock.stamp("prefill_returned")
            params = getattr(prefill_response, "kv_transfer_params", None) or {}
            clock.prompt_tokens = params.get("remote_num_tokens")
        return self._backend.prepare_decode_request(request=request, peer=peer, prefill_response=prefill_response)


class SelectiveDecodeServer(_MeteredMixin, PDDecodeServer):
    """Decode role: remote prefill for long prompts (Ray's P/D hand-off), local prefill for short ones."""

    async def __init__(
        self,
        llm_config: LLMConfig,
        *,
        prefill_server: DeploymentHandle,
        remote_prefill_min_tokens: int = 0,
        failover: Optional[FailoverSpec] = None,
        **kwargs,
    ):
        keep_replica_log()  # before the engine starts: NIXL's logging.config would close the replica's log file
        self._remote_prefill_min_tokens = remote_prefill_min_tokens
        self._handoff_backend: Optional[_HandoffClockBackend] = None
        self._init_metrics(llm_config, mode="disaggregated", role="decode")
        await super().__init__(llm_config, prefill_server=prefill_server, **kwargs)
        self._failover = PrefillFailover(failover or FailoverSpec(), self._prefill_handle, model=llm_config.model_id)
        self._failover.kv_warming = getattr(self, "_prewarm_task", None)  # local prefill until the handshake is done
        self._failover.roles.ensure_started()
        if remote_prefill_min_tokens > 0:
            self._check_prompt_counting()
        logger.info(
            "SelectiveDecodeServer ready: prompts with fewer than %d tokens are prefilled locally on decode",
            remote_prefill_min_tokens,
        )
        settle_serving_process()

    def reconfigure(self, user_config: Optional[dict[str, Any]]) -> None:
        """Serve's user_config: a new `remote_prefill_min_tokens` is in force from the next request on."""
        live = parse_live(user_config)
        if "remote_prefill_min_tokens" not in live.model_fields_set:
            return
        threshold = live.remote_prefill_min_tokens
        if threshold > 0 and self._remote_prefill_min_tokens <= 0:
            self._check_prompt_counting()
        if threshold != self._remote_prefill_min_tokens:
            logger.info("live config: remote_prefill_min_tokens %d -> %d (prompts shorter than that are prefilled "
                        "locally from the next request on; nothing restarted)", self._remote_prefill_min_tokens, threshold)
        self._remote_prefill_min_tokens = threshold

    def _check_prompt_counting(self) -> None:
        if not all(
            hasattr(getattr(self.engine, name, None), method)
            for name, method in (
                ("_oai_serving_chat", "render_chat_request"),
                ("_oai_serving_completion", "render_completion_request"),
            )
        ):
            raise RuntimeError(
                "SelectiveDecodeServer: this Ray/vLLM pair does not expose the engine's chat/completion "
                "renderers that selective disaggregation counts prompt tokens with. Set "
                "remote_prefill_min_tokens: 0 to disable it, or pin the versions in versions.env."
            )

    async def _maybe_prewarm(self) -> None:
        """Ray's pre-warm (kv_transfer.prewarm: one tiny request through every prefill replica, so the NIXL
        handshake is not a user's first request) in the background: Ray runs it inside __init__ and retries
        for up to 5 minutes while prefill is not up, which would keep decode from serving at all."""
        self._prewarm_task = asyncio.get_running_loop().create_task(self._prewarm_in_background())

    async def _prewarm_in_background(self) -> None:
        """Up to PREWARM_ATTEMPTS of Ray's pre-warm, each once prefill has a serving replica and each bounded by
        kv_transfer.prewarm_timeout_s (bounded_prewarm)."""
        configs = self._llm_config.experimental_configs
        if not configs.get(PREWARM):
            return  # kv_transfer.prewarm off: Ray's pre-warm does nothing, nothing to bound or report
        default = KVTransferSpec.model_fields["prewarm_timeout_s"].default
        await prewarm_until_done(super()._maybe_prewarm, lambda: getattr(self, "_failover", None),
                                 float(configs.get(PREWARM_TIMEOUT_S, default)))

    def _get_connector_backend(self):
        if self._handoff_backend is None:
            self._handoff_backend = _HandoffClockBackend(super()._get_connector_backend())
        return self._handoff_backend

    async def chat(self, request: ChatCompletionRequest, raw_request_info: Optional[RawRequestInfo] = None):
        return await self._serve(request, raw_request_info, LLMServer.chat)

    async def completions(self, request: CompletionRequest, raw_request_info: Optional[RawRequestInfo] = None):
        return await self._serve(request, raw_request_info, LLMServer.completions)

    async def _serve(self, request: Request, raw: Optional[RawRequestInfo], run_local: Callable):
        refuse_if_engine_dead(self)
        if (why := out_of_vocab(self, request)) is not None:
            return client_error(why, "prompt")
        clock = HopClock(mode="disaggregated")
        clock.stamp("replica_received")
        # Whatever a client put in kv_transfer_params is not ours to honour: the decode engine would
        # try to pull KV from wherever it points.
        request.kv_transfer_params = None
        prompt_tokens = await self._count_prompt_tokens(request)
        if prompt_tokens is not None and prompt_tokens < self._remote_prefill_min_tokens:
            clock.path, clock.prompt_tokens = "local", prompt_tokens
            self._metrics.accepted("local", prompt_tokens)
            token = hops.CURRENT.set(clock)
            try:
                chunks = await run_local(self, request, raw)
            finally:
                hops.CURRENT.reset(token)
            return self._metered(chunks, request, clock, "local")
        clock.path = "remote"  # provisional: the failover may serve it locally ("fallback")
        return self._metered(self._remote(request, raw, clock), request, clock, "remote")

    async def _remote(self, request: Request, raw: Optional[RawRequestInfo], clock: HopClock):
        """The remote-prefill hand-off, run by `PrefillFailover` (deadlines, a retry on another prefill
        replica, local fallback), with the request's clock current while it prefills, hands off and
        builds the local decode stream (all of that happens before its first chunk)."""

        def on_path(path: Path) -> None:
            clock.path = path
            self._metrics.accepted(path)

        stream = self._failover.run(self, request, raw, on_path)
        token = hops.CURRENT.set(clock)
        try:
            first = await stream.__anext__()
        except StopAsyncIteration:
            return
        finally:
            hops.CURRENT.reset(token)
        yield first
        async for chunk in stream:
            yield chunk

    async def _count_prompt_tokens(self, request: Request) -> Optional[int]:
        """Prompt length in tokens exactly as this engine will prefill it (chat template, tools included).

        Renders with the engine's own vLLM serving objects (Ray 2.58's engine does not wire vLLM 0.26's
        tokenize endpoint). None when selective disaggregation is off (threshold 0: no rendering at all).
        A prompt the engine rejects (longer than the context, bad template input...) counts as 0: the
        local path returns the engine's own 4xx error without a prefill round trip. Batched prompts
        count by the longest.
        """
        if self._remote_prefill_min_tokens <= 0:
            return None
        copy = request.model_copy(deep=True)
        try:
            if isinstance(request, ChatCompletionRequest):
                serving = self.engine._oai_serving_chat
                rendered = await serving.render_chat_request(copy)
                inputs = rendered if _is_vllm_error(rendered) else rendered[1]
            else:
                serving = self.engine._oai_serving_completion
                inputs = await serving.render_completion_request(copy)
        except (ValueError, VLLMClientError) as exc:  # vLLM's validation errors (VLLMValidationError, 4xx)
            logger.info("selective disaggregation: prompt rejected by the renderer (%s); serving locally", exc)
            return 0
        if _is_vllm_error(inputs):
            logger.info("selective disaggregation: prompt rejected (%s); serving locally", inputs.error.message)
            return 0
        return max((serving._extract_prompt_len(engine_input) for engine_input in inputs), default=0)


def _is_vllm_error(value: Any) -> bool:
    return hasattr(value, "error") and hasattr(value.error, "message")


class DirectMeteredServer(DirectIngressMixin, MeteredServer):
    """Aggregated mode with `frontend.direct_streaming`: the engine replica serves HTTP itself."""


class DirectSelectiveDecodeServer(DirectIngressMixin, SelectiveDecodeServer):
    """Disaggregated decode with `frontend.direct_streaming`: the decode replica serves HTTP itself (our
    app, not Ray's P/D routes: the same remote/local prefill decision and failover as behind a frontend)."""


PREWARM_NOTE_EVERY_S = 60.0
PREWARM_ATTEMPTS = 3
PREWARM_CANCEL_WAIT_S = 10.0  # a cancelled pre-warm's abort gets this long


async def prewarm_until_done(start: Callable[[], Any], failover: Callable[[], Any], timeout_s: float, *,
                             attempts: int = PREWARM_ATTEMPTS, note_every_s: float = PREWARM_NOTE_EVERY_S,
                             poll_s: float = 1.0) -> bool:
    """Up to `attempts` pre-warms (`start()` makes one: Ray's coroutine), each once prefill has a serving replica
    (wait_for_prefill) and each bounded by `timeout_s` (bounded_prewarm); True when one finished."""
    for attempt in range(1, attempts + 1):
        await wait_for_prefill(failover, note_every_s, poll_s, unknown_for_s=timeout_s)
        if await bounded_prewarm(start(), timeout_s, note_every_s, attempt=attempt, attempts=attempts):
            return True
    return False


async def wait_for_prefill(failover: Callable[[], Any], note_every_s: float = PREWARM_NOTE_EVERY_S,
                           poll_s: float = 1.0, unknown_for_s: float = float("inf")) -> None:
    """Until the role watch (`failover().roles`, once the replica has one) reads a serving prefill replica. A
    pre-warm started while prefill's engines were still coming up is what hung on the real node (a first decode
    replica's, in 2 of 2 fresh-clone CI passes, 2026-12-05); and a pre-warm's deadline should time the hand-off,
    not prefill's start-up. While prefill is read down there is no bound: requests are prefilled on decode as
    before (or refused with prefill_unavailable), and it is said at WARNING every `note_every_s`. While its state
    cannot be read at all (the watch's reads fail), it stops waiting after `unknown_for_s`: Ray's pre-warm then waits
    for prefill itself, and a watch that cannot read must not keep disaggregation off."""
    started = noted = time.monotonic()
    while True:
        watch = failover()
        state = watch.roles.state("prefill") if watch is not None else None
        if state is not None and state.available:
            return
        now = time.monotonic()
        if state is None and now - started >= unknown_for_s:
            logger.warning("NIXL pre-warm starts without a read of prefill's state (none in %.0f s: see the role "
                           "watch's warnings)", now - started)
            return
        if now - noted >= note_every_s:
            noted = now
            logger.warning("NIXL pre-warm waits for a serving prefill replica (%.0f s so far; %s): this decode "
                           "replica prefills requests itself until then", now - started,
                           state.describe() if state is not None else "prefill's state not read yet")
        await asyncio.sleep(poll_s)


def prewarm_step(task: asyncio.Future) -> str:
    """Which step Ray's pre-warm coroutine (`PDDecodeServer._maybe_prewarm`) is waiting in, for the operator:
    read from its frame's locals (Ray's names; a Ray that names them otherwise gets "step unknown"). Waiting for
    prefill points at the prefill replicas; pulling the KV points at NIXL between the pods."""
    coro = task.get_coro() if isinstance(task, asyncio.Task) else None
    frame = getattr(coro, "cr_frame", None)
    seen = frame.f_locals if frame is not None else {}
    if "decode_reqs" in seen:
        return (f"step: pulling the pre-warm's KV from {len(seen['decode_reqs'])} prefill replica(s) into this "
                "decode engine over NIXL")
    if "attempt" in seen:
        return f"step: waiting for the prefill replicas to prefill the pre-warm request (Ray's try {seen['attempt']})"
    return "step unknown"


async def bounded_prewarm(prewarm: Any, timeout_s: float, note_every_s: float = PREWARM_NOTE_EVERY_S, *,
                          attempt: int = PREWARM_ATTEMPTS, attempts: int = PREWARM_ATTEMPTS) -> bool:
    """Run one attempt (`attempt` of `attempts`) of Ray's NIXL pre-warm (a coroutine) for at most `timeout_s`;
    True when it finished.

    While it runs, decode prefills every request itself (kv_handshake_pending), so a pre-warm that never ends
    would turn disaggregation off for the replica's life, silently: on the real node one did not finish in 8
    minutes (2026-12-05, a fresh-clone CI pass). So it is said at WARNING every `note_every_s` with the step it
    waits in (Serve buffers a replica's INFO lines; WARNING reaches the log at once), and at `timeout_s` it is
    cancelled (vLLM aborts the pre-warm's decode request). After the last attempt requests go to prefill again,
    each KV pull bounded by the failover's kv_transfer_timeout_s."""
    of = f"attempt {attempt} of {attempts}"
    then = (f"trying again once prefill has a serving replica (attempt {attempt + 1} of {attempts}); requests "
            "are prefilled on decode meanwhile" if attempt < attempts else
            "requests go to prefill again from now on, each KV pull bounded by failover.kv_transfer_timeout_s. If "
            "pulls then time out (failover reason kv_timeout), check prefill's engine log and that the NIXL "
            "side-channel port is open between the prefill and decode pods")
    started = time.monotonic()
    task = asyncio.ensure_future(prewarm)
    try:
        while True:
            left = timeout_s - (time.monotonic() - started)
            done, _ = await asyncio.wait({task}, timeout=max(0.0, min(note_every_s, left)))
            waited = time.monotonic() - started
            if done:
                exc = task.exception()
                if exc is not None:
                    logger.warning("NIXL pre-warm (%s) failed after %.0f s (%s: %s); %s",
                                   of, waited, type(exc).__name__, exc, then)
                    return False
                logger.info("NIXL pre-warm done in %.1f s (%s): requests are prefilled remotely from now on",
                            waited, of)
                return True
            if waited >= timeout_s:
                logger.warning("NIXL pre-warm (%s) not done after %.0f s (kv_transfer.prewarm_timeout_s; %s): "
                               "cancelled; %s.", of, waited, prewarm_step(task), then)
                return False
            logger.warning("NIXL pre-warm (%s) still running after %.0f s (%s): this decode replica prefills every "
                           "request itself until it is done (failover reason kv_handshake_pending; cancelled at "
                           "%.0f s)", of, waited, prewarm_step(task), timeout_s)
    finally:
        if not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=PREWARM_CANCEL_WAIT_S)  # an abort that hangs too must not hold us

