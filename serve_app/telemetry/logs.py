"""Loggers of serve_app's request-path modules: children of Serve's `ray.serve` logger.

Why not Ray Serve LLM's `get_logger`: it gives a module imported before Serve set up the replica's
logging its own stderr handler (and stops propagation), and an engine replica imports our modules that
early. In Serve's high-throughput mode (RAY_SERVE_LOG_TO_STDERR=0) such lines reach no file at all, so
the failover line an operator needs at 3 a.m. was lost. A plain child logger propagates to the handlers
Serve attaches to `ray.serve`: the replica's own log file, serve/replica_<app>_<deployment>_<id>.log.

In that mode Serve also puts a `logging.handlers.MemoryHandler` of 1000 records in front of that file
(RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE), flushed only when full or on ERROR: a failover WARNING of a
quiet replica sat in memory and was in no file on a real node. Our WARNING and above are flushed at once
(`_FlushOurWarnings`, a filter on each of our loggers); INFO lines stay buffered with Serve's.
"""

from __future__ import annotations

import logging
import logging.handlers

PREFIX = "ray.serve.serve_app"


def get_logger(name: str) -> logging.Logger:
    logger = logging.getLogger(f"ray.serve.{name}")
    if not any(isinstance(f, _FlushOurWarnings) for f in logger.filters):
        logger.addFilter(_FlushOurWarnings())
    return logger


def _flush_ours(should_flush):  # type: ignore[no-untyped-def]
    def should(record: logging.LogRecord) -> bool:
        return should_flush(record) or (record.levelno >= logging.WARNING and record.name.startswith(PREFIX))

    should.rld_flushes_warnings = True  # type: ignore[attr-defined]
    return should


class _FlushOurWarnings(logging.Filter):
    """Lets every record through; on a WARNING or above, makes sure each buffering handler of `ray.serve`
    flushes it at once. A filter, not a handler: outside a Serve replica (no handler configured) Python's
    last-resort stderr handler still prints our warnings. Serve attaches its handlers when the replica starts,
    possibly after our modules were imported, so this looks at the time of the record."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            for handler in logging.getLogger("ray.serve").handlers:
                if isinstance(handler, logging.handlers.MemoryHandler) and not getattr(
                    handler.shouldFlush, "rld_flushes_warnings", False
                ):
                    handler.shouldFlush = _flush_ours(handler.shouldFlush)  # type: ignore[method-assign]
        return True
