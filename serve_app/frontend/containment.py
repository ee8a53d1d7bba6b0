"""Containment: a request that killed an engine is not replayed, and is refused once it did so again.

Why: vLLM can be made to fail by a single request (e.g. prompt logprobs over a long prompt allocate a
vocabulary-wide logit row per prompt token outside the engine's memory budget, vLLM #38830). Before this,
such a request was replayed on another prefill replica, then prefilled on decode, then sent to another
decode replica, and clients retry 503s: one request could take down most of a fleet.

The rule, everywhere a request meets an engine:
- the engine died *while running this request* (vLLM's EngineDeadError from its call, or the in-band
  error vLLM's serving layer makes of it): no retry, no fallback; the client gets 503
  `engine_failed_on_request` (errors.KilledEngine) and the request's fingerprint gets a strike here;
- the engine or its replica was gone *before* the request reached it (the replica reports
  `EngineDeadBeforeDispatch`, or Ray says the actor is dead/unavailable, or no replica could be
  chosen): that is not the request's doing, and it may be sent elsewhere as before.

A fingerprint is the SHA-256 of the request's canonical JSON without the fields that do not change what
the engine computes (`stream`, `stream_options`, `user`, `request_id`, `metadata`). After
`containment.strikes` engine deaths within `containment.quarantine_s` the same request is refused with 400
`request_quarantined` until the window ends. Fingerprints live in the frontend replica's memory (per serving
replica with direct streaming), at most `containment.max_fingerprints`, oldest first out.

Counted in ray_rld_contained_requests_total{event="killed_engine"|"refused"}; the chart's
RLDRequestKilledEngine alert fires on any killed_engine (docs/runbooks.md).
"""

from __future__ import annotations

import collections
import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from ray.exceptions import RayTaskError

from serve_app.config import ContainmentSpec
from serve_app.frontend.errors import ENGINE_DEAD_MARK, OpenAIError
from serve_app.telemetry.logs import get_logger

logger = get_logger(__name__)

# Fields that change how a response is delivered or labelled, not what the engine computes.
NOT_FINGERPRINTED = frozenset({"stream", "stream_options", "user", "request_id", "metadata"})


class EngineDeadBeforeDispatch(RuntimeError):
    """Raised by a serving replica whose engine was already dead when a request arrived: the request did
    not cause it and may go to another replica."""


def _cause_name(exc: BaseException) -> str:
    cause = getattr(exc, "cause", None)
    return type(cause).__name__ if isinstance(cause, BaseException) else ""


def dead_before_dispatch(exc: BaseException) -> bool:
    """A replica call failed because the replica's engine was already dead when the request arrived."""
    return (
        type(exc).__name__ == "EngineDeadBeforeDispatch"
        or _cause_name(exc) == "EngineDeadBeforeDispatch"
        or "EngineDeadBeforeDispatch" in str(exc)[:2000]
    )


def engine_died_running(exc: BaseException) -> bool:
    """A replica call failed because its vLLM engine died while running the request (EngineDeadError),
    as opposed to an engine or replica that was gone before it (`dead_before_dispatch`, Ray's
    ActorDiedError/ActorUnavailableError: Ray cannot tell whether an actor died before or during a call,
    and vLLM's poison requests kill the engine core, which the replica reports as EngineDeadError)."""
    if dead_before_dispatch(exc):
        return False
    if type(exc).__name__ == "EngineDeadError" or _cause_name(exc) == "EngineDeadError":
        return True
    text = str(exc)[:2000]
    return isinstance(exc, RayTaskError) and ("EngineDeadError" in text or ENGINE_DEAD_MARK in text)


def fingerprint(kind: str, data: dict[str, Any]) -> str:
    """The request's identity for containment: linear in its size, independent of key order."""
    canonical = {k: v for k, v in data.items() if k not in NOT_FINGERPRINTED}
    text = json.dumps([kind, canonical], sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


class Quarantined(OpenAIError):
    def __init__(self, until_s: float) -> None:
        super().__init__(
            400,
            "This exact request made this endpoint's engines fail repeatedly; it is refused for the next "
            f"{until_s:.0f} s. Change the request (e.g. a shorter prompt, no prompt logprobs) or ask the operator.",
            code="request_quarantined",
        )


class _Counter:
    """ray.util.metrics objects are created in the replica, lazily."""

    def __init__(self, model: str) -> None:
        self._model = model
        self._counter: Any = None

    def inc(self, event: str) -> None:
        if self._counter is None:
            from ray.util.metrics import Counter

            self._counter = Counter(
                "rld_contained_requests",
                description="Requests contained after an engine died running them: killed_engine (not "
                "replayed, fingerprinted) and refused (a quarantined fingerprint answered 400).",
                tag_keys=("model", "event"),
            )
        self._counter.inc(1, tags={"model": self._model, "event": event})


@dataclass
class _Strikes:
    count: int
    until: float


class Containment:
    """Fingerprints of requests that killed engines, in one frontend replica (one event loop: no locks)."""

    def __init__(
        self,
        spec: ContainmentSpec,
        *,
        model: str = "",
        clock: Callable[[], float] = time.monotonic,
        counter: Optional[Callable[[str], None]] = None,
    ) -> None:
        self.spec = spec
        self._clock = clock
        self._strikes: collections.OrderedDict[str, _Strikes] = collections.OrderedDict()
        self._count = counter or _Counter(model).inc

    def _live(self, key: str) -> Optional[_Strikes]:
        entry = self._strikes.get(key)
        if entry is not None and entry.until <= self._clock():
            del self._strikes[key]
            return None
        return entry

    def check(self, key: str, request_id: str = "") -> None:
        """Raise Quarantined (400) when `key` has killed engines `strikes` times within the window."""
        if not self.spec.enabled:
            return
        entry = self._live(key)
        if entry is not None and entry.count >= self.spec.strikes:
            self._count("refused")
            logger.warning("containment: refused request_id=%s (fingerprint %s… killed %d engines)",
                           request_id, key[:12], entry.count)
            raise Quarantined(entry.until - self._clock())

    def killed_engine(self, key: str, request_id: str = "", where: str = "") -> None:
        """The request with fingerprint `key` was running on an engine that died: one strike."""
        self._count("killed_engine")
        logger.error("containment: an engine died running request_id=%s (%s; fingerprint %s…); not replayed",
                     request_id, where or "engine", key[:12])
        if not self.spec.enabled:
            return
        entry = self._live(key)
        until = self._clock() + self.spec.quarantine_s
        if entry is None:
            self._strikes[key] = _Strikes(1, until)
        else:
            entry.count += 1
            entry.until = until
            self._strikes.move_to_end(key)
        while len(self._strikes) > self.spec.max_fingerprints:
            self._strikes.popitem(last=False)

    def strikes(self, key: str) -> int:
        entry = self._live(key)
        return entry.count if entry else 0
