"""The frontend's request guards: a short chain behind one small protocol.

Modelled on Ray Serve LLM's `LLMMiddleware.before_inference` (return the request, or a response that ends
it) and the Gateway API Inference Extension's admission plugins (`AdmitRequest(...) error`: a request runs
only if every plugin agrees). Each guard looks at one validated request (`Admit`) and either lets it through
(returns None), ends it with a response of its own (overflow: another backend served it), or refuses it by
raising an OpenAIError (4xx/5xx, OpenAI-shaped). A guard that holds something for the request's lifetime
(an admission slot) registers its release on the request; the ingress runs those when the response is
done, failed or abandoned.

The chain, in order (BoundedOpenAiIngress builds it):

  ContainmentGate   a request that keeps killing engines is refused (400 request_quarantined)
  RoleGate          a needed role without running replicas: overflow if allowed, else 503 + Retry-After
  SaturationGate    the admission queue is over overflow's threshold: overflow serves it
  AdmissionGate     slots weighted by sequences (prompts x n); 429 + Retry-After beyond the queue

Every guard is unit-tested alone with fakes (tests/unit/test_guards.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Optional, Protocol, Sequence

from starlette.responses import Response

from serve_app.frontend.admission import Admission
from serve_app.frontend.containment import Containment
from serve_app.frontend.errors import RoleUnavailable
from serve_app.frontend.overflow import Overflow, OverflowFailed
from serve_app.telemetry.logs import get_logger

logger = get_logger(__name__)


@dataclass
class Admit:
    """One validated request as the guards see it."""

    kind: str  # "chat" | "completions"
    data: dict[str, Any]  # the client's JSON body (validated)
    model_id: str
    request_id: str
    fingerprint: str
    max_tokens: Optional[int]  # the output cap the engines apply (None: up to the context)
    weight: int  # engine sequences: prompts x n
    releases: list[Callable[[], None]] = field(default_factory=list)

    def release_all(self) -> None:
        while self.releases:
            self.releases.pop()()


class Guard(Protocol):
    name: str

    async def admit(self, request: Admit) -> Optional[Response]:
        """None: next guard. A Response: the request is answered (no later guard, no engine). Raise an
        OpenAIError to refuse it."""
        ...


async def run_guards(guards: Sequence[Guard], request: Admit) -> Optional[Response]:
    """Run `guards` in order; the first response ends the chain. On a refusal (or any error), whatever the
    earlier guards hold is released before the error goes on."""
    try:
        for guard in guards:
            response = await guard.admit(request)
            if response is not None:
                return response
    except BaseException:
        request.release_all()
        raise
    return None


class ContainmentGate:
    name = "containment"

    def __init__(self, containment: Containment) -> None:
        self.containment = containment

    async def admit(self, request: Admit) -> Optional[Response]:
        self.containment.check(request.fingerprint, request.request_id)
        return None


async def _overflow(overflow: Overflow, request: Admit, reason: str) -> Optional[Response]:
    try:
        return await overflow.forward(
            request.kind, request.data, model_id=request.model_id, reason=reason,
            request_id=request.request_id, max_tokens=request.max_tokens,
        )
    except OverflowFailed:
        return None


class RoleGate:
    """503 naming the role when a role the request needs has no running replica (or overflow serves it)."""

    name = "roles"

    def __init__(self, blocking_role: Callable[[], Awaitable[Optional[RoleUnavailable]]], overflow: Overflow) -> None:
        self._blocking_role = blocking_role
        self._overflow = overflow

    async def admit(self, request: Admit) -> Optional[Response]:
        blocked = await self._blocking_role()
        if blocked is None:
            return None
        if self._overflow.on_role_unavailable():
            response = await _overflow(self._overflow, request, f"{blocked.role}_unavailable")
            if response is not None:
                return response
        logger.warning("request_id=%s: %s (%s)", request.request_id, blocked.message, blocked.detail)
        raise blocked


class SaturationGate:
    """Overflow when this frontend's admission queue is over overflow's threshold."""

    name = "saturation"

    def __init__(self, admission: Admission, overflow: Overflow) -> None:
        self._admission = admission
        self._overflow = overflow

    async def admit(self, request: Admit) -> Optional[Response]:
        if self._overflow.on_saturation(
            would_queue=self._admission.would_queue(request.weight), queued=self._admission.queued
        ):
            return await _overflow(self._overflow, request, "saturated")
        return None


class AdmissionGate:
    """A bounded queue; the request holds `weight` slots until its response is done."""

    name = "admission"

    def __init__(self, admission: Admission) -> None:
        self._admission = admission

    async def admit(self, request: Admit) -> Optional[Response]:
        request.releases.append(await self._admission.acquire(request.weight))
        return None

