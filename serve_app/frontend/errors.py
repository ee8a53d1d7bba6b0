"""OpenAI-shaped errors: every non-2xx answer of the app is `{"error": {message, type, param, code}}`.

One module so the ASGI guards (auth, limits) and the ingress handlers answer alike. Every response
carries the request id (header `x-request-id`, set by Serve's proxy; 500 messages name it too) and the
log lines about a failed request name it, so an operator can find what goes with a client's report. Bodies never carry exception text from other processes:
a remote traceback tells a client nothing and an attacker too much.
"""

from __future__ import annotations

import re
from typing import Any, Optional

from fastapi import status
from fastapi.responses import JSONResponse

from serve_app.frontend.edge import role_unavailable_message, send_json_error
from serve_app.upstream import ErrorInfo, ErrorResponse, OpenAIHTTPException

# vLLM's EngineDeadError message, also what its serving layer puts in an in-band error when the engine died.
ENGINE_DEAD_MARK = "EngineCore encountered an issue"
# The ErrorResponse type a decode replica answers with when a prefill engine died running the request.
KILLED_ENGINE_TYPE = "request_killed_engine"
# decode's answer when a request could be prefilled neither remotely nor locally (serve_app/engine/failover.py):
# its message is built here for clients (no replica ids, no exception text) and passes through the frontend.
PREFILL_UNAVAILABLE_TYPE = "prefill_unavailable"
PREFILL_UNAVAILABLE_WHY = {
    "prefill_unavailable": "the prefill role has no running replica",
    "routing_timeout": "every prefill replica is at capacity",
    "timeout": "the prefill replicas are not answering in time (overloaded or wedged)",
    "kv_peer_lost": "the prefill replica that computed this request's KV cache went away before decode loaded it",
    "kv_timeout": "the KV cache transfer from the prefill replica stalled",
    "kv_handshake_pending": "the decode replica is still connecting to the prefill replicas",
}
PREFILL_UNAVAILABLE_DEFAULT_WHY = "the prefill replicas are failing"
MAX_CLIENT_TEXT = 300
# What must never reach a client from another process's error: tracebacks, source paths, addresses, pids,
# Ray task/actor names.
_INTERNAL = re.compile(
    r"Traceback|File \"|\bpid[=:]|\bip[=:]|\d{1,3}(?:\.\d{1,3}){3}|\[[0-9a-f:]+\]|ray::|actor_id|node_id|"
    r"/(?:usr|home|tmp|opt|root|site-packages)/|0x[0-9a-f]{6,}",
    re.IGNORECASE,
)


def client_text(text: Any) -> Optional[str]:
    """An engine's or validator's message as a client may read it: the first line, at most MAX_CLIENT_TEXT
    characters, or None when it carries anything internal (then say something generic instead)."""
    value = str(text).strip()
    first = value.splitlines()[0].strip() if value else ""
    if not first or _INTERNAL.search(first):
        return None
    return first[:MAX_CLIENT_TEXT]
RETRY_HINT = (
    "Serve restarts failed engine replicas; retry in a minute. Operators: check `serve status` and the "
    "replica logs (serve/replica_*.log, worker-*.err)."
)


class OpenAIError(OpenAIHTTPException):
    """An error answered as OpenAI does: HTTP status + {"error": {message, type, param, code}}."""

    def __init__(
        self,
        status_code: int,
        message: str,
        *,
        param: Optional[str] = None,
        code: Optional[str] = None,
        retry_after_s: Optional[int] = None,
        kind: Optional[str] = None,
    ):
        kind = kind or ("invalid_request_error" if status_code < 500 else "server_error")
        super().__init__(status_code, message, type=kind)
        self.param = param
        self.code = code
        self.retry_after_s = retry_after_s

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after_s)} if self.retry_after_s is not None else {}

    def as_error_response(self) -> ErrorResponse:
        """The same error as a stream event (vLLM's ErrorInfo wants the HTTP status as code)."""
        return ErrorResponse(
            error=ErrorInfo(message=self.message, type=self.type, param=self.param, code=self.status_code)
        )

    @classmethod
    def from_engine(cls, error: ErrorResponse, what: str) -> "OpenAIError":
        """vLLM/Ray reported the error: 4xx keep their status, message and param (validation, context
        length...); 5xx mean the engine itself failed and become a retryable 503."""
        info = error.error
        try:
            status_code = int(info.code or 500)
        except (TypeError, ValueError):
            status_code = 500
        if info.type == KILLED_ENGINE_TYPE or ENGINE_DEAD_MARK in (info.message or ""):
            return KilledEngine(what)
        if info.type == PREFILL_UNAVAILABLE_TYPE:
            # ours (prefill_unavailable_response): capacity or an outage of the prefill role, not a failed engine
            retry = getattr(info, "retry_after_s", None)
            return OpenAIError(
                status.HTTP_503_SERVICE_UNAVAILABLE,
                f"{what}: {client_text(info.message) or PREFILL_UNAVAILABLE_DEFAULT_WHY}",
                code=PREFILL_UNAVAILABLE_TYPE,
                retry_after_s=retry if isinstance(retry, int) and retry > 0 else 10,
            )
        if status_code >= 500 or status_code < 400:
            # The engine's own text stays in the replica's log: it may hold a remote traceback.
            return EngineUnavailable(f"{what}: the engine failed. {RETRY_HINT}")
        message = client_text(info.message) or "The engine rejected the request."
        code = "context_length_exceeded" if "maximum context length" in message else None
        param = info.param
        if code:  # vLLM names its internal "input_tokens"; the client's field is the prompt
            param = "messages" if "chat" in what else "prompt"
        return cls(status_code, message, param=param, code=code)


def prefill_unavailable_response(reason: str, retry_after_s: int, *, fallback_full: bool) -> ErrorResponse:
    """What decode answers when neither a prefill replica nor decode itself (local fallback off or full) can
    prefill the request. `reason` is the last PrefillFailure's label; the operator's detail (replica, exception)
    stays in decode's log, the client gets what happened and when to retry."""
    why = PREFILL_UNAVAILABLE_WHY.get(reason, PREFILL_UNAVAILABLE_DEFAULT_WHY)
    also = " and decode is already prefilling as many requests itself as it may" if fallback_full else ""
    return ErrorResponse(error=ErrorInfo(
        message=f"No prefill capacity for this request: {why}{also}. Retry after {retry_after_s} s.",
        type=PREFILL_UNAVAILABLE_TYPE, code=503, retry_after_s=retry_after_s,
    ))


class EngineUnavailable(OpenAIError):
    def __init__(self, message: str, *, retry_after_s: int = 10) -> None:
        super().__init__(
            status.HTTP_503_SERVICE_UNAVAILABLE, message, code="engine_unavailable", retry_after_s=retry_after_s
        )


class KilledEngine(EngineUnavailable):
    """An engine died while it ran this request: it is not sent to another engine (containment), and the
    frontend counts it against the request's fingerprint."""

    def __init__(self, what: str) -> None:
        super().__init__(
            f"{what}: the engine serving this request failed while running it. The request was not retried on "
            "other engines; a request that keeps failing engines is refused for a while. Operators: see the "
            "RLDRequestKilledEngine runbook."
        )
        self.code = "engine_failed_on_request"


class RoleUnavailable(OpenAIError):
    """A serving role (prefill or decode) has no running replica: fail fast instead of queueing. Serve's own
    message about the role (it may quote a replica's traceback) is kept as `detail` for the log only."""

    def __init__(self, role: str, detail: str, *, retry_after_s: int) -> None:
        super().__init__(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            role_unavailable_message(role, retry_after_s),
            code=f"{role}_unavailable",
            retry_after_s=retry_after_s,
        )
        self.role = role
        self.detail = detail


def error_json(error: OpenAIError) -> JSONResponse:
    # No x-request-id here: Serve's proxy adds it to every response.
    return JSONResponse(status_code=error.status_code, content=error.body(), headers=error.headers())


async def send_error(send: Any, error: OpenAIError, *, close_connection: bool = False) -> None:
    """Answer `error` from a pure ASGI middleware (before FastAPI runs); `close_connection`: the server closes the
    connection after it (the rest of the request is not worth reading, e.g. a body past its deadline)."""
    await send_json_error(send, error.status_code, error.body(), headers=error.headers(), close_connection=close_connection)
