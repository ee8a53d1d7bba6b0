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


# ---- the replica's log file outlives a library's logging.config call (NIXL, vLLM) ----


@pytest.fixture()
def replica_logging(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """ray.serve set up by Serve's own configure_component_logger, as in a replica in high-throughput mode
    (buffer of 1000), writing to tmp_path; a fake replica context says which replica it is."""
    import builtins
    import sys
    import types

    from serve_app import upstream

    monkeypatch.setattr(upstream.resolve("ray_worker"), "_global_node", types.SimpleNamespace(max_bytes=10**7, backup_count=1),
                        raising=False)
    replica_id = upstream.resolve("ReplicaID")(
        unique_id="abc123", deployment_id=upstream.resolve("DeploymentID")(name="Decode:tiny", app_name="llm"))
    context = types.SimpleNamespace(replica_id=replica_id,
                                    _deployment_config=types.SimpleNamespace(logging_config={"logs_dir": str(tmp_path)}))
    monkeypatch.setattr(upstream, "get_internal_replica_context", lambda: context, raising=False)
    serve = logging.getLogger("ray.serve")
    saved = serve.handlers[:], serve.level, serve.propagate, sys.stdout, sys.stderr, builtins.print

    def configure() -> None:
        upstream.resolve("configure_component_logger")(
            component_type=upstream.resolve("ServeComponentType").REPLICA, component_name="llm_Decode:tiny",
            component_id="abc123", logging_config=upstream.resolve("LoggingConfig")(logs_dir=str(tmp_path)),
            buffer_size=1000)
        sys.stdout, sys.stderr, builtins.print = saved[3:]  # pytest's capture stays in place

    configure()
    yield lambda: "\n".join(p.read_text() for p in sorted(tmp_path.glob("replica_*.log")))
    serve.handlers[:], serve.level, serve.propagate = saved[:3]
    sys.stdout, sys.stderr, builtins.print = saved[3:]


def library_logging_config() -> None:
    """What NIXL's setup_logging and vLLM's logger do: a dictConfig, which closes every handler."""
    import logging.config

    logging.config.dictConfig({"version": 1, "disable_existing_loggers": False,
                               "loggers": {"nixl": {"level": "INFO", "propagate": False}}})


def test_without_keep_a_library_logging_config_loses_the_replica_log(replica_logging) -> None:  # type: ignore[no-untyped-def]
    """The failure on the real node, reproduced with Serve's own handlers: after the dictConfig even Serve's
    ERROR reaches no file (the MemoryHandler lost its target)."""
    library_logging_config()
    logging.getLogger("ray.serve").error("Serve's own ERROR")
    assert "Serve's own ERROR" not in replica_logging()


def test_kept_replica_log_survives_a_library_logging_config(replica_logging) -> None:  # type: ignore[no-untyped-def]
    from serve_app.telemetry.logs import keep_replica_log

    keep_replica_log()  # a replica's constructor, before its engine starts
    library_logging_config()  # the engine starts: NIXL's agent
    get_logger("serve_app.engine.failover").warning("prefill failover request_id=r2: ... (path=fallback)")
    logging.getLogger("ray.serve").error("Serve's own ERROR")
    text = replica_logging()
    assert "prefill failover request_id=r2" in text and "Serve's own ERROR" in text


def test_a_replica_log_closed_before_keep_is_set_up_again(replica_logging) -> None:  # type: ignore[no-untyped-def]
    library_logging_config()  # before any keep_replica_log: the handler has no file any more
    get_logger("serve_app.engine.failover").warning("prefill failover request_id=r3")
    logging.getLogger("ray.serve").info("an INFO line after it, buffered")
    logging.getLogger("ray.serve").error("Serve's own ERROR")
    text = replica_logging()
    assert "prefill failover request_id=r3" in text and "Serve's own ERROR" in text
    assert "an INFO line after it" in text  # flushed with the ERROR, by Serve's own handler again
