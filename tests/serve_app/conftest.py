"""The serve_app suite runs on the stack it shares with tests/monitoring (tests/shared_stack.py: disagg at /,
agg at /agg, auth on)."""

from __future__ import annotations

from typing import Iterator

import httpx
import pytest
from openai import OpenAI

from devstack.stack import LocalStack
from tests.shared_stack import API_KEY

from .serve_helpers import authorized_client


@pytest.fixture(scope="package")
def stack(serve_stack: LocalStack) -> LocalStack:
    return serve_stack


@pytest.fixture(scope="package")
def disagg(stack: LocalStack) -> OpenAI:
    return OpenAI(base_url=stack.base_url("disagg"), api_key=API_KEY, timeout=180, max_retries=0)


@pytest.fixture(scope="package")
def agg(stack: LocalStack) -> OpenAI:
    return OpenAI(base_url=stack.base_url("agg"), api_key=API_KEY, timeout=180, max_retries=0)


@pytest.fixture(scope="package")
def http(stack: LocalStack) -> Iterator[httpx.Client]:
    with authorized_client(stack, API_KEY) as client:
        yield client
