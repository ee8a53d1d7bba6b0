"""Setup calls to an OpenAI-compatible server (model discovery, /tokenize, calibration probes).

Plain urllib so that these calls stay out of Locust's statistics; under Locust, gevent's
monkey-patching makes them cooperative.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from .profiles import Api


class ServerError(RuntimeError):
    pass


@dataclass(frozen=True)
class Endpoints:
    """URLs derived from the host the user gave (`http://h:8000` or `http://h:8000/v1`)."""

    root: str  # scheme://host:port[/prefix], without /v1
    api_prefix: str  # path prefix Locust requests use relative to the host ("/v1" or "")

    @classmethod
    def from_host(cls, host: str) -> Endpoints:
        if not host:
            raise ValueError("no host: pass -H/--host, e.g. http://127.0.0.1:8000")
        parts = urlsplit(host.rstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"host {host!r} is not an http(s) URL")
        path = parts.path.rstrip("/")
        if path.endswith("/v1"):
            root_path, api_prefix = path[: -len("/v1")], ""
        else:
            root_path, api_prefix = path, "/v1"
        root = urlunsplit((parts.scheme, parts.netloc, root_path, "", ""))
        return cls(root=root, api_prefix=api_prefix)

    @property
    def v1(self) -> str:
        return self.root + "/v1"

    def path(self, api: Api) -> str:
        """Path relative to Locust's host for a generation request."""
        return f"{self.api_prefix}/{'chat/completions' if api == 'chat' else 'completions'}"


class SetupClient:
    """Blocking JSON calls used before and around a load test."""

    def __init__(self, endpoints: Endpoints, api_key: str | None = None, timeout_s: float = 60.0) -> None:
        self.endpoints = endpoints
        self.api_key = api_key
        self.timeout_s = timeout_s

    def _call(self, method: str, url: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        headers = {"Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            text = e.read()[:500].decode(errors="replace")
            return e.code, text
        except (urllib.error.URLError, OSError) as e:
            raise ServerError(f"{method} {url}: {e}") from e

    def model_cards(self) -> list[dict[str, Any]]:
        code, data = self._call("GET", self.endpoints.v1 + "/models")
        if code != 200 or not isinstance(data, dict):
            raise ServerError(f"GET {self.endpoints.v1}/models: HTTP {code}: {data}")
        return [m for m in data.get("data", []) if isinstance(m, dict) and "id" in m]

    def models(self) -> list[str]:
        return [m["id"] for m in self.model_cards()]

    def max_model_len(self, model: str) -> int | None:
        """The context length the server reports for `model` (vLLM's model card has it)."""
        for card in self.model_cards():
            if card["id"] == model and card.get("max_model_len"):
                return int(card["max_model_len"])
        return None

    def first_model(self) -> str:
        ids = self.models()
        if not ids:
            raise ServerError(f"GET {self.endpoints.v1}/models lists no model; pass --model")
        return ids[0]


class ServerProbe:
    """`prompts.TokenizerProbe` over HTTP for one model and API."""

    def __init__(self, client: SetupClient, model: str, api: Api) -> None:
        self.client = client
        self.model = model
        self.api = api

    def tokenize(self, fragment: dict[str, Any], add_special_tokens: bool | None = None) -> dict[str, Any] | None:
        body: dict[str, Any] = {"model": self.model, **fragment}
        if add_special_tokens is not None:
            body["add_special_tokens"] = add_special_tokens
        url = self.client.endpoints.root + "/tokenize"
        code, data = self.client._call("POST", url, body)
        if code != 200 or not isinstance(data, dict) or "count" not in data:
            # No endpoint (404/405), or one that rejects this model or request form (Ray Serve
            # LLM 2.58 answers 400): the caller falls back to usage-based calibration.
            return None
        return data

    def prompt_tokens(self, fragment: dict[str, Any]) -> int:
        path = "chat/completions" if "messages" in fragment else "completions"
        url = f"{self.client.endpoints.v1}/{path}"
        code, data = self.client._call("POST", url, {"model": self.model, **fragment, "max_tokens": 1})
        if code != 200:
            raise ServerError(f"POST {url}: HTTP {code}: {data}")
        try:
            return int(data["usage"]["prompt_tokens"])
        except (KeyError, TypeError) as e:
            raise ServerError(f"POST {url}: response has no usage.prompt_tokens: {data}") from e
