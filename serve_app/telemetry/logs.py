"""Loggers of serve_app's request-path modules: children of Serve's `ray.serve` logger.

Why not Ray Serve LLM's `get_logger`: it gives a module imported before Serve set up the replica's
logging its own stderr handler (and stops propagation), and an engine replica imports our modules that
early. In Serve's high-throughput mode (RAY_SERVE_LOG_TO_STDERR=0) such lines reach no file at all, so
the failover line an operator needs at 3 a.m. was lost. A plain child logger propagates to the handlers
Serve attaches to `ray.serve`: the replica's own log file, serve/replica_<app>_<deployment>_<id>.log.
"""

from __future__ import annotations

import logging


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(f"ray.serve.{name}")
