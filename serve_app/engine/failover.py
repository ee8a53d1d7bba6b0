"""Prefill failure semantics of the decode role, in one place (used by SelectiveDecodeServer).

Ray's P/D orchestration (`PDOrchestratorMixin._pd_handle_request`) sends prefill with no deadline and
passes any prefill failure to the client (a 500 with a Ray traceback, or a hang until the ingress's
300 s first-token timeout). Before the first token nothing has reached the client, so decode can still
do better; this module runs the same hand-off (the connector backend's `prepare_prefill_request` /
`prepare_decode_request`, then the local engine) with a ladder:

  1. remote prefill on a replica chosen within `routing_timeout_s`, answered within `prefill_timeout_s`;
  2. on failure (error 5xx, dead/unreachable replica, deadline): once more on *another* replica
     (replicas that just failed are skipped for `suspect_s`);
  3. then prefill locally on decode (`path="fallback"`): the client gets a normal answer, only slower.
     At most `max_local_fallbacks` at once per decode replica; beyond that, or with
     `local_fallback: false`, the request ends with 503 naming the prefill role.

A prefill engine that died *while running this request* (vLLM's EngineDeadError) ends the ladder at once:
no retry on another replica, no local fallback (the request may be what killed it: containment, see
serve_app/frontend/containment.py); decode answers an ErrorResponse of type `request_killed_engine`, which
the frontend turns into 503 `engine_failed_on_request` and a strike on the request's fingerprint. A prefill
replica whose engine was already dead (EngineDeadBeforeDispatch), or that Ray reports dead or unreachable,
is not the request's doing: the ladder goes on.

After prefill answered, decode's engine pulls the KV from that prefill replica (NIXL) before its first token.
A pull from a peer that vanished (its pod deleted mid-transfer) has no deadline of its own in vLLM: it stays
pending. So decode watches that window (`kv_transfer_timeout_s`): once Serve shows the prefill role without a
running replica, or a streamed request's first token has not come by the deadline, the decode request is
aborted and the ladder goes on at step 3 (reasons `kv_peer_lost`, `kv_timeout`).

A prefill role that Serve reports without running replicas (RoleWatch) goes straight to step 3, and so does
every request while decode's NIXL pre-warm (its first hand-off with the prefill replicas, `kv_warming`) is still
running (`kv_handshake_pending`): on the real node, requests whose KV pull started during a new decode replica's
pre-warm handshake (38 s on a loaded node) never got their KV, not even after the handshake completed
(docs/real-node.md); local prefill needs no transfer.
A prefill that answers 4xx (bad request, prompt too long) is the client's error and is passed through.
KV that cannot be loaded after a successful prefill is recomputed by vLLM itself
(`kv_transfer.load_failure_policy: recompute`). After the first token, failures are the ingress's to
report (an SSE error event and [DONE]); nothing here retries a started stream.

Every failover logs one line (request id, what failed, where, what served) and is counted in
ray_rld_prefill_failovers_total{reason, served_by}.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator, Callable, Optional

from ray.serve.handle import DeploymentHandle

from serve_app.upstream import (
    ChatCompletionRequest,
    ErrorInfo,
    ErrorResponse,
    LLMServer,
    get_serve_request_id,
    reuse_prompt_token_ids,
    session_id_from_headers,
)
from serve_app.config import FailoverSpec
from serve_app.frontend.containment import engine_died_running
from serve_app.frontend.errors import ENGINE_DEAD_MARK, KILLED_ENGINE_TYPE, prefill_unavailable_response
from serve_app.telemetry.logs import get_logger
from serve_app.roles import RoleWatch

logger = get_logger(__name__)


class PrefillFailure(Exception):
    """One remote prefill attempt failed; `reason` is a short metric label, str() the operator's detail."""

    def __init__(self, reason: str, detail: str, replica: Optional[str] = None, *, contained: bool = False) -> None:
        super().__init__(detail)
        self.reason = reason
        self.replica = replica
        self.contained = contained  # the engine died running this request: no retry, no fallback


class _Counters:
    def __init__(self, tags: dict[str, str]) -> None:
        self._tags = tags
        self._counter: Any = None

    def inc(self, reason: str, served_by: str) -> None:
        if self._counter is None:
            from ray.util.metrics import Counter

            self._counter = Counter(
                "rld_prefill_failovers",
                description="Remote prefills that failed before the first token, by reason, and what served "
                "the request instead (retry: another prefill replica, fallback: decode itself, error: nobody).",
                tag_keys=("model", "reason", "served_by"),
            )
        self._counter.inc(1, tags={**self._tags, "reason": reason, "served_by": served_by})


class PrefillFailover:
    """Runs one request's prefill -> decode hand-off for a PDDecodeServer subclass (`server`)."""

    def __init__(self, spec: FailoverSpec, prefill: DeploymentHandle, *, model: str, clock: Callable[[], float] = time.monotonic):
        self.spec = spec
        self._prefill = prefill  # options(stream=True), as Ray's PDDecodeServer keeps it
        self._clock = clock
        self._suspects: dict[str, float] = {}  # replica id -> until
        self._local_fallbacks = 0
        self._counters = _Counters({"model": model})
        self.roles = RoleWatch({"prefill": prefill.deployment_name}, poll_s=spec.status_poll_s)
        self.kv_warming: Optional[asyncio.Future] = None  # decode's NIXL pre-warm while it runs (SelectiveDecodeServer)

    async def run(self, server: Any, request: Any, raw: Any, on_path: Callable[[str], None]) -> AsyncIterator[Any]:
        """The response chunks of `request`; calls `on_path("remote" | "fallback")` once the path is known."""
        method = "chat" if isinstance(request, ChatCompletionRequest) else "completions"
        request_id = get_serve_request_id() or getattr(request, "request_id", "?")
        backend = server._get_connector_backend()
        if backend.requires_peer_binding or backend.concurrent_handoff:
            # Connectors that bind or stream concurrently (MoRIIO) keep Ray's own orchestration.
            on_path("remote")
            async for chunk in server._pd_handle_request(request, raw):
                yield chunk
            return

        prefill_chunk, failures, replica = await self._remote_prefill(server, backend, method, request, raw, request_id)
        if isinstance(prefill_chunk, ErrorResponse):
            on_path("remote")
            yield prefill_chunk  # the client's error (4xx), as prefill reported it
            return
        if prefill_chunk is not None:
            if failures:
                self._record(request_id, failures, "retry")
            prefilled_at = self._clock()
            decode_request = backend.prepare_decode_request(request=request, peer=None, prefill_response=prefill_chunk)
            with reuse_prompt_token_ids(server._decode_reuse_ids(prefill_chunk)):
                chunks = await getattr(LLMServer, method)(server, decode_request, raw)
                try:
                    first = await self._first_decode_chunk(chunks, replica, prefilled_at, bool(getattr(request, "stream", False)))
                except StopAsyncIteration:
                    on_path("remote")
                    return
                except PrefillFailure as lost:  # the KV's prefill peer is gone (or silent): this request's KV never comes
                    if lost.replica:
                        self._suspects[lost.replica] = self._clock() + self.spec.suspect_s
                    failures = [lost]
                else:
                    on_path("remote")
                    yield first
                    async for chunk in chunks:
                        yield chunk
                    return

        if failures and failures[-1].contained:
            self._record(request_id, failures, "contained")
            on_path("remote")
            yield ErrorResponse(
                error=ErrorInfo(
                    message="The prefill engine failed while running this request; it was not retried.",
                    type=KILLED_ENGINE_TYPE,
                    code=503,
                )
            )
            return
        if not self.spec.local_fallback or self._local_fallbacks >= self.spec.max_local_fallbacks:
            self._record(request_id, failures, "error")  # the operator's detail: decode's log and metric
            on_path("remote")
            yield prefill_unavailable_response(
                failures[-1].reason if failures else "prefill_unavailable",
                self.spec.retry_after_s,
                fallback_full=self.spec.local_fallback,
            )
            return
        self._record(request_id, failures, "fallback")
        on_path("fallback")
        self._local_fallbacks += 1
        try:
            chunks = await getattr(LLMServer, method)(server, request, raw)
            async for chunk in chunks:
                yield chunk
        finally:
            self._local_fallbacks -= 1

    def _record(self, request_id: str, failures: list[PrefillFailure], served_by: str) -> None:
        for failure in failures:
            self._counters.inc(failure.reason, served_by)
        what = "; then ".join(f"{f.reason}: {f}" for f in failures)
        served = {
            "retry": "served by another prefill replica",
            "fallback": "prefilled locally on decode (path=fallback)",
            "error": "answered 503",
            "contained": "answered 503 without a retry or fallback (the engine died running it)",
        }[served_by]
        log = logger.error if served_by in ("error", "contained") else logger.warning
        log("prefill failover request_id=%s: %s -> %s", request_id, what, served)

    async def _remote_prefill(
        self, server: Any, backend: Any, method: str, request: Any, raw: Any, request_id: str
    ) -> tuple[Any, list[PrefillFailure], Optional[str]]:
        """(prefill chunk | client ErrorResponse | None, failures so far, the replica that answered)."""
        failures: list[PrefillFailure] = []
        down = self.roles.unavailable("prefill")
        if down is not None:
            return None, [PrefillFailure("prefill_unavailable", down.describe())], None
        if self.kv_warming is not None and not self.kv_warming.done():
            return None, [PrefillFailure(
                "kv_handshake_pending",
                "this decode replica's NIXL pre-warm (its first KV hand-off with the prefill replicas) is still "
                "running; a KV pull started now could stall behind it",
            )], None
        handle = self._prefill
        if raw is not None:
            session_id = session_id_from_headers(raw.headers)
            if session_id:
                handle = handle.options(session_id=session_id)
        prefill_method = getattr(handle, method)
        prefill_request = backend.prepare_prefill_request(request=request, peer=None)
        server._request_prefill_token_ids(prefill_request)
        attempts = 2 if self.spec.retry_other_prefill else 1
        for _ in range(attempts):
            try:
                chunk, replica = await self._attempt(prefill_method, prefill_request, raw)
                return chunk, failures, replica
            except PrefillFailure as failure:
                failures.append(failure)
                if failure.replica:
                    self._suspects[failure.replica] = self._clock() + self.spec.suspect_s
                if failure.contained:
                    break  # the request may be what killed that engine: never replay it
                if failure.reason in ("routing_timeout", "no_healthy_replica", "unavailable"):
                    break  # no replica to route to: another attempt would only wait again
        return None, failures, None

    async def _first_decode_chunk(self, chunks: Any, replica: Optional[str], since: float, streamed: bool) -> Any:
        """The decode stream's first chunk after a remote prefill answered at `since`.

        Before it, decode's engine pulls the request's KV from the prefill replica that computed it (NIXL).
        That pull has no deadline of its own: when the peer's process or pod vanishes mid-pull (UCX over TCP
        to an address that no longer exists), vLLM's read stays pending and the request would wait for the
        ingress's first-token deadline (timeouts.first_token_s, 300 s). So, for `kv_transfer_timeout_s` after
        prefill's answer:
          - once a read of Serve taken after `since` finds the prefill role without a running replica, the
            KV's peer is gone: PrefillFailure("kv_peer_lost") at once;
          - a streamed request whose first token has not come by then: PrefillFailure("kv_timeout").
        (A non-streamed response is one chunk at the end of generation: past the window it is the ingress's
        deadline that bounds it.) On either failure the decode request is cancelled, so vLLM aborts it and
        frees its blocks; the caller goes on down the ladder (local prefill, or 503)."""
        iterator = chunks.__aiter__()
        task = asyncio.ensure_future(iterator.__anext__())
        window_end = since + self.spec.kv_transfer_timeout_s
        step = min(1.0, self.spec.status_poll_s)
        failed = False
        try:
            while True:
                remaining = window_end - self._clock()
                if remaining <= 0 and not streamed:
                    return await task  # the ingress's non-stream deadline bounds the rest
                done, _ = await asyncio.wait({task}, timeout=max(0.0, min(step, remaining)))
                if done:
                    return task.result()
                down = self.roles.unavailable("prefill", since=since)
                if down is not None:
                    failed = True
                    raise PrefillFailure(
                        "kv_peer_lost",
                        f"prefill replica {replica}, which holds this request's KV cache, went away before decode "
                        f"loaded it ({down.describe()})",
                        replica,
                    )
                if streamed and self._clock() >= window_end:
                    failed = True
                    raise PrefillFailure(
                        "kv_timeout",
                        f"decode produced no first token within {self.spec.kv_transfer_timeout_s:.1f} s of prefill "
                        f"replica {replica}'s answer (the KV transfer from it stalled)",
                        replica,
                    )
        finally:
            if not task.done():
                task.cancel()  # vLLM aborts the request and frees its blocks
                await asyncio.wait({task})
            if failed:
                aclose = getattr(iterator, "aclose", None)
                if aclose is not None:
                    await aclose()

    def _is_suspect(self, replica_id: str) -> bool:
        until = self._suspects.get(replica_id)
        if until is None:
            return False
        if until <= self._clock():
            del self._suspects[replica_id]
            return False
        return True

    async def _attempt(self, prefill_method: Any, prefill_request: Any, raw: Any) -> tuple[Any, str]:
        deadline = self._clock() + self.spec.routing_timeout_s
        # Pick a replica that did not just fail; a few picks, all within the routing deadline.
        for _ in range(3):
            remaining = deadline - self._clock()
            if remaining <= 0:
                break
            context = prefill_method.choose_replica(prefill_request, raw)
            try:
                selection = await asyncio.wait_for(context.__aenter__(), timeout=remaining)
            except asyncio.TimeoutError:
                raise PrefillFailure(
                    "routing_timeout",
                    f"no prefill replica could be chosen within {self.spec.routing_timeout_s:.1f} s "
                    "(none running, or all at capacity)",
                ) from None
            except Exception as exc:  # noqa: BLE001 - DeploymentUnavailableError, router errors
                raise PrefillFailure("unavailable", f"choosing a prefill replica failed: {type(exc).__name__}: {exc}") from exc
            replica = str(selection.replica_id)
            try:
                if self._is_suspect(replica):
                    continue
                return await self._call(prefill_method, selection, prefill_request, raw, replica), replica
            finally:
                await context.__aexit__(None, None, None)
        raise PrefillFailure(
            "no_healthy_replica",
            f"every prefill replica the router offered failed in the last {self.spec.suspect_s:.0f} s",
        )

    async def _call(self, prefill_method: Any, selection: Any, prefill_request: Any, raw: Any, replica: str) -> Any:
        response = prefill_method.dispatch(selection, prefill_request, raw)
        try:
            chunk = await asyncio.wait_for(response.__anext__(), timeout=self.spec.prefill_timeout_s)
        except asyncio.TimeoutError:
            response.cancel()  # aborts the request on the prefill engine once it answers again
            raise PrefillFailure(
                "timeout", f"prefill replica {replica} did not answer within {self.spec.prefill_timeout_s:.1f} s", replica
            ) from None
        except StopAsyncIteration:
            raise PrefillFailure("error", f"prefill replica {replica} returned nothing", replica) from None
        except asyncio.CancelledError:
            response.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 - actor died/unavailable, engine dead, any RayTaskError
            if engine_died_running(exc):
                raise PrefillFailure(
                    "killed_engine", f"prefill replica {replica}'s engine died running it: {_short(exc)}", replica,
                    contained=True,
                ) from exc
            raise PrefillFailure("replica_failed", f"prefill replica {replica} failed: {_short(exc)}", replica) from exc
        try:
            # One token was asked for: the stream ends right away. Drain it so Serve's accounting closes.
            await asyncio.wait_for(_drain(response), timeout=self.spec.prefill_timeout_s)
        except Exception:  # noqa: BLE001 - we already have what we need
            response.cancel()
        if isinstance(chunk, ErrorResponse):
            code = int(chunk.error.code or 500)
            if code < 500:
                return chunk
            if chunk.error.type == KILLED_ENGINE_TYPE or ENGINE_DEAD_MARK in (chunk.error.message or ""):
                raise PrefillFailure(
                    "killed_engine", f"prefill replica {replica}'s engine died running it", replica, contained=True
                )
            raise PrefillFailure("error", f"prefill replica {replica} answered {code}: {chunk.error.message}", replica)
        if not getattr(chunk, "kv_transfer_params", None):
            raise PrefillFailure("error", f"prefill replica {replica} returned no kv_transfer_params", replica)
        return chunk


async def _drain(response: Any) -> None:
    async for _ in response:
        pass


def _short(exc: BaseException) -> str:
    """One line about an exception: its type and the first line of its message (no remote traceback)."""
    cause = getattr(exc, "cause", None)
    target = cause if isinstance(cause, BaseException) else exc
    first = str(target).strip().splitlines()[0] if str(target).strip() else ""
    return f"{type(target).__name__}: {first[:200]}"

