"""Helpers of the serve_app end-to-end tests: Prometheus scraping of Ray's metrics export, bounded polling."""

from __future__ import annotations

import time
from typing import Callable

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

from devstack.cluster import METRICS_REPORT_INTERVAL_MS

Series = dict[tuple[str, frozenset], float]


def scrape(url: str) -> Series:
    """Every sample of a Prometheus endpoint, keyed by (name, labels)."""
    text = httpx.get(url, timeout=30).text
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def total(series: Series, name: str, **labels: str) -> float:
    """Sum of `name` over the series whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(v for (n, lbls), v in series.items() if n == name and wanted <= lbls)


def label_values(series: Series, name: str, label: str, **labels: str) -> set[str]:
    wanted = set(labels.items())
    return {dict(lbls)[label] for (n, lbls), _ in series.items() if n == name and wanted <= lbls and label in dict(lbls)}


def wait_until(what: str, check: Callable[[], bool], timeout_s: float = 60, every_s: float = 2) -> None:
    """Ray's metrics agent exports every few seconds: poll, bounded."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for: {what}")


def settled(url: str, prefixes: tuple[str, ...] = ("ray_rld_", "ray_vllm_"), timeout_s: float = 60) -> Series:
    """A scrape that no longer changes between two export intervals: every earlier request is counted."""
    interval_s = METRICS_REPORT_INTERVAL_MS / 1000 + 1
    deadline = time.monotonic() + timeout_s

    def relevant(series: Series) -> Series:
        return {k: v for k, v in series.items() if k[0].startswith(prefixes)}

    previous = relevant(scrape(url))
    while time.monotonic() < deadline:
        time.sleep(interval_s)
        current = relevant(scrape(url))
        if current == previous:
            return current
        previous = current
    raise AssertionError(f"metrics at {url} still changing after {timeout_s:.0f} s")


def engine_core_of(stack, replica_title: str) -> psutil.Process:  # type: ignore[no-untyped-def]
    """The vLLM EngineCore process under the stack's process whose title contains `replica_title`."""
    for proc in stack.cluster.processes():
        try:
            if replica_title in " ".join(proc.cmdline()):
                cores = [c for c in proc.children(recursive=True) if "EngineCore" in " ".join(c.cmdline())]
                if cores:
                    return cores[0]
        except psutil.NoSuchProcess:
            continue
    raise AssertionError(f"no VLLM::EngineCore under a process titled {replica_title!r}")


def authorized_client(stack, api_key: str) -> httpx.Client:  # type: ignore[no-untyped-def]
    """An httpx client for the stack's HTTP port sending `api_key`."""
    return httpx.Client(base_url=f"http://127.0.0.1:{stack.ports.http}",
                        headers={"Authorization": f"Bearer {api_key}"}, timeout=180)
