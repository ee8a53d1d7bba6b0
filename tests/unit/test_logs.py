"""serve_app's loggers under Serve's buffered replica logging (high-throughput mode: a MemoryHandler of 1000
records in front of the replica's log file, flushed only when full or on ERROR). A failover WARNING must reach
the file at once; INFO may wait with Serve's own lines; nothing else changes."""

from __future__ import annotations

import logging
import logging.handlers

import pytest

from serve_app.telemetry.logs import get_logger


class ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture()
def serve_buffer():  # type: ignore[no-untyped-def]
    """ray.serve as Serve configures it in a replica: a MemoryHandler(1000, flush on ERROR) -> the file."""
    serve = logging.getLogger("ray.serve")
    saved = (serve.handlers[:], serve.level, serve.propagate)
    file_ = ListHandler()
    memory = logging.handlers.MemoryHandler(capacity=1000, target=file_, flushLevel=logging.ERROR)
    serve.handlers[:] = [memory]
    serve.setLevel(logging.INFO)
    serve.propagate = False
    yield memory, file_
    serve.handlers[:], serve.level, serve.propagate = saved


def test_our_warnings_reach_the_file_at_once_info_waits(serve_buffer) -> None:  # type: ignore[no-untyped-def]
    memory, file_ = serve_buffer
    log = get_logger("serve_app.engine.failover")
    log.info("routine line")
    assert file_.messages == []  # buffered with Serve's lines
    log.warning("prefill failover request_id=r1")
    assert file_.messages == ["routine line", "prefill failover request_id=r1"]


def test_serves_own_warnings_keep_serves_buffering(serve_buffer) -> None:  # type: ignore[no-untyped-def]
    memory, file_ = serve_buffer
    get_logger("serve_app.roles").warning("ours")  # installs the flush rule
    logging.getLogger("ray.serve.other").warning("not ours")
    assert file_.messages == ["ours"]
    logging.getLogger("ray.serve.other").error("Serve's own ERROR still flushes")
    assert file_.messages[-1] == "Serve's own ERROR still flushes"


def test_a_handler_configured_after_import_is_covered(serve_buffer) -> None:  # type: ignore[no-untyped-def]
    """An engine replica imports our modules before Serve configures its logging."""
    log = get_logger("serve_app.engine.servers")
    memory, file_ = serve_buffer
    late = ListHandler()
    logging.getLogger("ray.serve").addHandler(logging.handlers.MemoryHandler(1000, target=late))
    log.warning("after a late handler")
    assert late.messages == ["after a late handler"]
    assert file_.messages == ["after a late handler"]


def test_the_rule_is_installed_once(serve_buffer) -> None:  # type: ignore[no-untyped-def]
    memory, file_ = serve_buffer
    log = get_logger("serve_app.frontend.app")
    assert get_logger("serve_app.frontend.app") is log
    assert len(log.filters) == 1
    for _ in range(3):
        log.warning("w")
    assert getattr(memory.shouldFlush, "rld_flushes_warnings", False)
    wrapped = memory.shouldFlush.__closure__[0].cell_contents  # what the rule wraps: Serve's own, not itself
    assert not getattr(wrapped, "rld_flushes_warnings", False)
    assert file_.messages == ["w", "w", "w"]


def test_outside_serve_warnings_still_reach_stderr(capsys) -> None:  # type: ignore[no-untyped-def]
    """No handler on ray.serve (a script, a unit test): Python's last-resort handler prints our warnings —
    the flush rule is a filter, not a handler that would swallow them."""
    serve = logging.getLogger("ray.serve")
    saved = serve.handlers[:], serve.propagate
    serve.handlers[:] = []
    root_saved = logging.getLogger().handlers[:]
    logging.getLogger().handlers[:] = []
    try:
        get_logger("serve_app.roles").warning("visible without Serve")
    finally:
        serve.handlers[:], serve.propagate = saved
        logging.getLogger().handlers[:] = root_saved
    assert "visible without Serve" in capsys.readouterr().err
