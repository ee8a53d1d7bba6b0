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

And that file must survive the engine: `logging.config.dictConfig` (NIXL calls it when an engine creates its
agent, vLLM on import) closes every handler of the process, and a closed MemoryHandler drops its file, so
every later line of the replica, Serve's and ours, stayed in memory: on a real node the engine replicas' log
files stopped after Serve's first lines. `keep_replica_log()`, called first in each replica's constructor
(before its engine starts) and on each of our warnings, makes Serve's handlers outlive such a call, and
reattaches the file with Serve's own set-up if it was closed before.
"""

from __future__ import annotations

import builtins
import logging
import logging.handlers
import sys

PREFIX = "ray.serve.serve_app"
_reattach_failed = False


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
    """Lets every record through; on a WARNING or above, runs `keep_replica_log()`, so each buffering handler
    of `ray.serve` flushes it at once. A filter, not a handler: outside a Serve replica (no handler configured) Python's
    last-resort stderr handler still prints our warnings. Serve attaches its handlers when the replica starts,
    possibly after our modules were imported, so this looks at the time of the record."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            keep_replica_log()
        return True


def keep_replica_log() -> None:
    """Each buffering handler of `ray.serve` writes our WARNING+ at once, and outlives a library's
    `logging.config` call (see the module's doc): its close only flushes (its file handler, closed too, reopens
    on the next line); one already closed (no target) is set up again by Serve's own
    `configure_component_logger`. Outside a replica (no MemoryHandler on `ray.serve`) it does nothing."""
    for handler in logging.getLogger("ray.serve").handlers:
        if not isinstance(handler, logging.handlers.MemoryHandler):
            continue
        if handler.target is None:
            _reattach_replica_log()
            return
        if not getattr(handler, "rld_kept", False):
            handler.close = handler.flush  # type: ignore[method-assign]
            handler.rld_kept = True  # type: ignore[attr-defined]
        if not getattr(handler.shouldFlush, "rld_flushes_warnings", False):
            handler.shouldFlush = _flush_ours(handler.shouldFlush)  # type: ignore[method-assign]


def _reattach_replica_log() -> None:
    """The replica's logging as Serve set it up (Replica._configure_logger_and_profilers), without wrapping
    stdout/stderr/print a second time. Never raises: the request path must not fail on logging."""
    global _reattach_failed
    if _reattach_failed:
        return
    streams = sys.stdout, sys.stderr, builtins.print
    try:
        from serve_app.upstream import (
            LoggingConfig,
            RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE,
            ServeComponentType,
            configure_component_logger,
            get_internal_replica_context,
        )

        context = get_internal_replica_context()
        if context is None:
            raise RuntimeError("no Serve replica context in this process")
        deployment = context.replica_id.deployment_id
        name = f"{deployment.app_name}_{deployment.name}" if deployment.app_name else deployment.name
        config = context._deployment_config.logging_config
        if not isinstance(config, LoggingConfig):
            config = LoggingConfig(**(config or {}))
        configure_component_logger(
            component_type=ServeComponentType.REPLICA,
            component_name=name,
            component_id=context.replica_id.unique_id,
            logging_config=config,
            buffer_size=RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE,
        )
        keep_replica_log()
    except Exception as e:  # noqa: BLE001 - reported once, below
        _reattach_failed = True
        print(
            f"serve_app: the replica's log file handler was closed (a library called logging.config) and could "
            f"not be set up again ({type(e).__name__}: {e}); this replica's later lines are in no file",
            file=sys.__stderr__,
        )
    finally:
        sys.stdout, sys.stderr, builtins.print = streams
