"""API keys: 401 without or with a wrong key, 200 with each configured key, rotation by rewriting the
key file (no restart), readiness open, rejections counted."""

from __future__ import annotations

import httpx
import pytest
from .resilience_helpers import API_KEYS, cluster_metrics, error_of, measured, total, wait_until

from devstack.serve_config import MODEL_ID
from devstack.stack import LocalStack

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

CHAT = {"model": MODEL_ID, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


def rejections(stack: LocalStack, reason: str) -> float:
    return total(cluster_metrics(stack), "ray_rld_auth_rejections_total", reason=reason)


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer not-a-key"}, {"Authorization": "Basic abc"}],
                         ids=["no-key", "wrong-key", "not-bearer"])
def test_requests_without_a_valid_key_get_401(anonymous: httpx.Client, headers: dict[str, str]) -> None:
    for method, path, body in (("GET", "/v1/models", None), ("POST", "/v1/chat/completions", CHAT),
                               ("POST", "/v1/completions", {"model": MODEL_ID, "prompt": "hi"})):
        response = anonymous.request(method, path, json=body, headers=headers)
        assert response.status_code == 401, (path, response.text)
        error = error_of(response)
        assert error["code"] == "invalid_api_key" and error["type"] == "invalid_request_error"
        assert response.headers["www-authenticate"] == "Bearer"
        assert response.headers.get("x-request-id")
        if not headers and path == "/v1/chat/completions":
            measured(f"auth: {method} {path} without a key -> {response.status_code} {response.text}")


def test_each_configured_key_is_accepted(anonymous: httpx.Client) -> None:
    for key in API_KEYS:
        headers = {"Authorization": f"Bearer {key}"}
        models = anonymous.get("/v1/models", headers=headers)
        assert models.status_code == 200, models.text
        assert [m["id"] for m in models.json()["data"]] == [MODEL_ID]
        chat = anonymous.post("/v1/chat/completions", json=CHAT, headers=headers)
        assert chat.status_code == 200, chat.text
        assert chat.json()["usage"]["completion_tokens"] == 4


def test_readiness_needs_no_key_and_tells_anonymous_callers_only_the_status(anonymous: httpx.Client) -> None:
    response = anonymous.get("/health")
    assert response.status_code == 200, response.text
    assert response.json() == {"status": "ok"}
    keyed = anonymous.get("/health", headers={"Authorization": f"Bearer {API_KEYS[0]}"})
    assert keyed.json()["roles"] == {"prefill": "ok", "decode": "ok"}
    # An app whose roles cannot be placed is not ready, and says so without a key too (and nothing more).
    unplaced = anonymous.get("/unplaced/health")
    assert unplaced.status_code == 503 and unplaced.json() == {"status": "unavailable"}, unplaced.text


def test_rejections_are_counted_by_reason(stack: LocalStack, anonymous: httpx.Client) -> None:
    before = {reason: rejections(stack, reason) for reason in ("missing", "invalid")}
    for _ in range(3):
        assert anonymous.get("/v1/models").status_code == 401
        assert anonymous.get("/v1/models", headers={"Authorization": "Bearer nope"}).status_code == 401
    wait_until(
        "3 more rejections of each reason in ray_rld_auth_rejections_total",
        lambda: all(rejections(stack, r) >= before[r] + 3 for r in before),
        timeout_s=30,
    )


def test_keys_rotate_by_rewriting_the_key_file(stack: LocalStack, anonymous: httpx.Client) -> None:
    old, kept = API_KEYS
    new = "rld-resilience-key-three"

    def status_with(key: str) -> int:
        return anonymous.get("/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code

    assert status_with(new) == 401
    try:
        stack.write_api_keys((kept, new))  # the Secret now holds the kept and a new key; the old one is gone
        wait_until("the new key to be accepted", lambda: status_with(new) == 200, timeout_s=15, every_s=0.5)
        assert status_with(old) == 401
        assert status_with(kept) == 200
    finally:
        stack.write_api_keys(API_KEYS)
    wait_until("the original keys to be accepted again", lambda: status_with(old) == 200, timeout_s=15, every_s=0.5)
    assert status_with(new) == 401
