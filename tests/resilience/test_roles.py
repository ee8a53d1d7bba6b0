"""A role that cannot be placed or has no running replica: requests get 503 with Retry-After within 5 s,
naming the role (instead of waiting 300 s in Serve's router); readiness reflects both roles."""

from __future__ import annotations

import time

import httpx
import pytest
from .resilience_helpers import error_of, measured

from devstack.serve_config import MODEL_ID

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

BODY = {"model": MODEL_ID, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_unplaceable_role_gets_503_naming_it_within_5_s(http: httpx.Client, stream: bool) -> None:
    started = time.monotonic()
    response = http.post("/unplaced/v1/chat/completions", json={**BODY, "stream": stream})
    elapsed = time.monotonic() - started
    measured(f"unplaceable role ({'stream' if stream else 'json'}): {response.status_code} after {elapsed:.2f} s, "
             f"Retry-After {response.headers.get('retry-after')}")
    assert response.status_code == 503, response.text
    assert elapsed < 5, f"answered after {elapsed:.1f} s"
    error = error_of(response)
    assert error["code"] == "decode_unavailable"
    assert "decode role is unavailable" in error["message"]
    assert "Decode:tiny" in error["message"] and "scheduled" in error["message"]  # Serve's placement message
    assert int(response.headers["retry-after"]) > 0


def test_readiness_reflects_both_roles(http: httpx.Client) -> None:
    ready = http.get("/health")
    assert ready.status_code == 200, ready.text
    assert ready.json() == {"status": "ok", "models": [MODEL_ID], "roles": {"decode": "ok", "prefill": "ok"}}

    unplaced = http.get("/unplaced/health")
    assert unplaced.status_code == 503, unplaced.text
    body = unplaced.json()
    assert body["status"] == "unavailable" and body["error"]["code"] == "decode_unavailable"
    assert set(body["roles"]) == {"decode", "prefill"}
    assert all(state.startswith("unavailable") for state in body["roles"].values()), body["roles"]
    assert unplaced.headers["retry-after"]

