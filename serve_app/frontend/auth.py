"""API keys at the ingress: `Authorization: Bearer <key>` against keys from a file and/or an env var.

Why here and not in vLLM: the engines serve no HTTP in this app (vLLM's --api-key never applies), and
Ray's token auth covers the dashboard/GCS, not Serve's HTTP port. So the ingress FastAPI app checks
every request, before the body is read, as a pure ASGI middleware.

- Keys come from AuthSpec.api_keys_file (a mounted Kubernetes Secret: one key per line) and/or
  AuthSpec.api_keys_env. The file is stat-ed at most once a second and re-read when it changed
  (Kubernetes swaps a Secret volume's symlink, which changes the inode), so rotation needs no restart.
- A file that cannot be read fails closed: no key is valid until it can (logged once per change).
- Comparison is constant time in the key: every configured key is compared with hmac.compare_digest,
  without stopping at the first match.
- Open paths (readiness) skip the check; a valid key there still marks the caller as a client (the scope
  state's CLIENT_KEY_STATE_KEY), which /health uses to decide how much it says. Serve's own /-/healthz
  and /-/routes never reach the ingress (app.EdgeGuard closes /-/routes where it can).
- Per-key prefix cache (`auth.cache_salt_per_key`; unset: on with more than one key): each valid key
  gets a salt derived from it (SHA-256, never the key itself) in the scope state; the ingress combines it
  with the client's own `cache_salt`, so tenants never share prefix-cache entries (no timing channel).
- Rejections: 401 with an OpenAI-style body and `WWW-Authenticate: Bearer`, counted in
  ray_rld_auth_rejections_total{reason="missing"|"invalid"}.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional


from serve_app.config import AuthSpec
from serve_app.frontend.errors import OpenAIError, send_error
from serve_app.telemetry.logs import get_logger

logger = get_logger(__name__)

FILE_RECHECK_S = 1.0
# Set in the ASGI scope's state for a caller with a valid key: that it has one, and its cache salt.
CLIENT_KEY_STATE_KEY = "rld_client_key"
CACHE_SALT_STATE_KEY = "rld_cache_salt"
OPEN_PATHS = frozenset({"/health"})


def parse_keys(text: str) -> tuple[str, ...]:
    """Keys from a file or env var: one per line or comma separated; blanks and # comments ignored."""
    keys = []
    for line in text.replace(",", "\n").splitlines():
        key = line.strip()
        if key and not key.startswith("#"):
            keys.append(key)
    return tuple(dict.fromkeys(keys))


@dataclass(frozen=True)
class _FileState:
    signature: Optional[tuple[int, int, int]]  # (inode, size, mtime_ns); None when unreadable
    keys: tuple[str, ...]


class ApiKeys:
    """The currently valid keys of one replica. Thread-safe; cheap to call per request."""

    def __init__(self, spec: AuthSpec, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._spec = spec
        self._clock = clock
        self._lock = threading.Lock()
        self._file = _FileState(signature=None, keys=())
        self._checked_at = float("-inf")
        self._env_keys: tuple[str, ...] = ()
        if spec.api_keys_env:
            value = os.environ.get(spec.api_keys_env)
            if value is None:
                logger.error(
                    "auth.api_keys_env: env var %s is not set in the ingress replica; no key from it is valid",
                    spec.api_keys_env,
                )
            self._env_keys = parse_keys(value or "")
        self._refresh_file(force=True)

    def _refresh_file(self, *, force: bool = False) -> None:
        path = self._spec.api_keys_file
        if not path:
            return
        now = self._clock()
        if not force and now - self._checked_at < FILE_RECHECK_S:
            return
        with self._lock:
            if not force and now - self._checked_at < FILE_RECHECK_S:
                return
            self._checked_at = now
            try:
                st = os.stat(path)
                signature = (st.st_ino, st.st_size, st.st_mtime_ns)
                if signature == self._file.signature:
                    return
                with open(path, encoding="utf-8") as f:
                    keys = parse_keys(f.read())
            except (OSError, UnicodeDecodeError) as exc:
                if self._file.signature is not None or force:
                    logger.error(
                        "auth.api_keys_file %s cannot be read (%s): every request is rejected until it can. "
                        "Check the Secret mount.",
                        path,
                        exc,
                    )
                self._file = _FileState(signature=None, keys=())
                return
            logger.info("auth: loaded %d API key(s) from %s", len(keys), path)
            if not keys:
                logger.error("auth.api_keys_file %s holds no key: every request is rejected", path)
            self._file = _FileState(signature=signature, keys=keys)

    def keys(self) -> tuple[str, ...]:
        self._refresh_file()
        return self._file.keys + self._env_keys

    def valid(self, presented: str) -> bool:
        candidate = presented.encode("utf-8", "surrogateescape")
        match = False
        for key in self.keys():
            # No early exit: the time taken does not tell which key (or how much of one) matched.
            match |= hmac.compare_digest(candidate, key.encode("utf-8"))
        return match

    def salts_per_key(self) -> bool:
        """Whether each key gets its own prefix-cache salt (auth.cache_salt_per_key; unset: several keys)."""
        setting = self._spec.cache_salt_per_key
        return len(self.keys()) > 1 if setting is None else setting


def cache_salt(key: str) -> str:
    """A key's prefix-cache namespace: derived one way from the key, so the salt reveals nothing about it."""
    return hashlib.sha256(b"rld-cache-salt\0" + key.encode("utf-8", "surrogateescape")).hexdigest()[:32]


def bearer_token(headers: Iterable[tuple[bytes, bytes]]) -> Optional[str]:
    """The token of an `Authorization: Bearer <token>` header, or None."""
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, token = value.decode("latin-1").strip().partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
            return None
    return None


class _RejectionCounter:
    """ray.util.metrics objects must be created inside the replica, not where the app is built."""

    def __init__(self) -> None:
        self._counter: Any = None

    def inc(self, reason: str) -> None:
        if self._counter is None:
            from ray.util.metrics import Counter

            self._counter = Counter(
                "rld_auth_rejections",
                description="Requests rejected with 401: no API key (missing) or an unknown one (invalid).",
                tag_keys=("reason",),
            )
        self._counter.inc(1, tags={"reason": reason})


class ApiKeyAuth:
    """ASGI middleware: 401 unless the request carries a valid key (open paths excepted)."""

    def __init__(self, app: Any, spec: AuthSpec, open_paths: frozenset[str] = OPEN_PATHS) -> None:
        self.app = app
        self.open_paths = open_paths
        self.keys = ApiKeys(spec)
        self.rejections = _RejectionCounter()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") == "OPTIONS":
            await self.app(scope, receive, send)
            return
        token = bearer_token(scope.get("headers", []))
        valid = token is not None and self.keys.valid(token)
        if valid:
            state = scope.setdefault("state", {})
            state[CLIENT_KEY_STATE_KEY] = True
            if self.keys.salts_per_key():
                state[CACHE_SALT_STATE_KEY] = cache_salt(token)
        if valid or _app_path(scope) in self.open_paths:
            await self.app(scope, receive, send)
            return
        reason = "missing" if token is None else "invalid"
        self.rejections.inc(reason)
        request_id = _request_id(scope)
        logger.info("auth: rejected %s %s (%s API key) request_id=%s", scope.get("method"), scope["path"], reason, request_id)
        if reason == "missing":
            message = (
                "No API key provided. Send it in an Authorization header using Bearer auth "
                "(Authorization: Bearer YOUR_KEY)."
            )
        else:
            message = "Incorrect API key provided. Ask the operator of this endpoint for a valid key."
        error = OpenAIError(401, message, code="invalid_api_key", kind="invalid_request_error")
        await send_error(_with_header(send, b"www-authenticate", b"Bearer"), error)


def _app_path(scope: dict) -> str:
    """The path below the app's route prefix (Serve passes the full path plus root_path)."""
    path, root = scope.get("path", ""), scope.get("root_path", "")
    return path[len(root):] or "/" if root and path.startswith(root) else path


def _request_id(scope: dict) -> Optional[str]:
    for name, value in scope.get("headers", []):
        if name.lower() == b"x-request-id":
            return value.decode("latin-1")
    return None


def _with_header(send: Any, name: bytes, value: bytes) -> Any:
    async def wrapped(message: dict) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), (name, value)]}
        await send(message)

    return wrapped
