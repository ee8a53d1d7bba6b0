"""What runs in front of the app in Serve's own HTTP servers: the node's Serve proxy (HAProxy's backup, or every
request without HAProxy) and each ingress replica's direct-ingress server. Serve loads `proxy_middlewares` from
RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH (the chart and the local stack set it on every Ray process).

  EdgeGuard          400 for an x-request-id that is not short visible ASCII (Ray's middleware would raise on
                     non-UTF-8 and answer 500); Serve's /-/routes closed
  HeldRequestGuard   (Serve's proxy only, serve_app/frontend/held.py) a request the proxy holds while its app's
                     ingress deployment has no running replica: 503 naming the role instead of a wait

This module stays light on purpose (no vLLM, no FastAPI): Serve's proxy imports it, and the proxy runs on every
node, the head included. The frontend's own errors (errors.py) are written by the same `send_json_error`.
"""

from __future__ import annotations

import json
from typing import Any, Optional

REQUEST_ID_HEADER = "x-request-id"
REQUEST_ID_HEADER_BYTES = REQUEST_ID_HEADER.encode()
MAX_REQUEST_ID_BYTES = 256
CLOSED_PATHS = frozenset({"/-/routes"})
# How Serve finds these middlewares: this env var, in every Ray process (the chart's pod env and the local stack's
# for the proxies, the replicas' runtime_env from llm_configs for an app deployed on any Ray cluster).
EDGE_CALLBACK_ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
EDGE_CALLBACK = "serve_app.frontend.edge:proxy_middlewares"


def openai_error_body(message: str, *, status_code: int, param: Optional[str] = None,
                      code: Optional[str] = None, kind: Optional[str] = None) -> dict[str, Any]:
    kind = kind or ("invalid_request_error" if status_code < 500 else "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


async def send_json_error(send: Any, status_code: int, body: dict[str, Any], *, headers: Optional[dict[str, str]] = None,
                          close_connection: bool = False) -> None:
    """Answer an OpenAI-shaped error from a pure ASGI middleware; `close_connection`: the server closes the
    connection after it (the rest of the request is not worth reading, e.g. a body past its deadline)."""
    data = json.dumps(body).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    if close_connection:
        raw.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status_code, "headers": raw})
    await send({"type": "http.response.body", "body": data})


def role_unavailable_message(role: str, retry_after_s: int) -> str:
    """The 503 a client gets when a serving role has no running replica (the frontend's and Serve's proxy's)."""
    return (
        f"The {role} role has no running replica. Retry after {retry_after_s} s. Operators: check "
        f"`serve status` (placement: `ray status`) and the {role} replica logs."
    )


def valid_request_id(value: bytes) -> bool:
    """A client's x-request-id is logged and passed to Ray, which decodes it as UTF-8: short visible ASCII only."""
    return 0 < len(value) <= MAX_REQUEST_ID_BYTES and all(0x21 <= b <= 0x7E for b in value)


class EdgeGuard:
    """Outermost ASGI middleware: 400 for a bad x-request-id (before anything decodes it), 404 for Serve's
    /-/routes (it lists every app's routes to anyone)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            if scope.get("path") in CLOSED_PATHS:
                message = f"Unknown path {scope['path']}."
                await send_json_error(send, 404, openai_error_body(message, status_code=404, code="not_found"))
                return
            for name, value in scope.get("headers", []):
                if name.lower() == REQUEST_ID_HEADER_BYTES and not valid_request_id(value):
                    message = f"Invalid x-request-id header: use 1 to {MAX_REQUEST_ID_BYTES} visible ASCII characters."
                    body = openai_error_body(message, status_code=400, param="x-request-id", code="invalid_request_id")
                    await send_json_error(send, 400, body)
                    return
        await self.app(scope, receive, send)


def proxy_middlewares() -> list:
    """For Serve's own HTTP servers: RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=serve_app.frontend.edge:proxy_middlewares
    in the Ray processes' env. (With HAProxy in front, HAProxy itself answers /-/routes from Ray's template.)"""
    from starlette.middleware import Middleware

    from serve_app.frontend.held import HeldRequestGuard

    return [Middleware(EdgeGuard), Middleware(HeldRequestGuard)]
