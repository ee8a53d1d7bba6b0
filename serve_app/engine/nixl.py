"""vLLM's NIXL connectors, loaded by vLLM from this module (`kv_connector_module_path`), with NIXL's UCX
progress thread off.

Why: NIXL's Python API builds every agent with `pthrDelay = 0`, and its UCX backend turns that delay into the
timeout of the progress thread's `poll()`: the thread never sleeps. Each engine worker that moves KV over UCX
then burns a core whether or not anything moves (measured on the local stack: ~80 % of a core per engine,
idle; 0 % with the thread off), which on a 2-core machine halves everything else. vLLM does not need the
thread: its connector drives UCX itself every engine step (the decode side polls its reads, the prefill side
its notifications), and the engine keeps stepping while a transfer is pending.

So importing this module (vLLM imports it in the engine's scheduler and worker processes, because the app
sets `kv_connector_module_path` to it) makes vLLM's NIXL worker create UCX-only agents without the progress
thread. Agents for other backends (LIBFABRIC over EFA) keep NIXL's defaults. The connector classes are
vLLM's own, re-exported under their registered names, so Ray Serve LLM and vLLM see `NixlConnector` /
`NixlPushConnector` as before.
"""

from __future__ import annotations

import functools
from typing import Any

from serve_app.upstream import NixlConnector, NixlPushConnector
from serve_app.upstream import nixl_base_worker as _worker

__all__ = ["NixlConnector", "NixlPushConnector", "MODULE_PATH"]

MODULE_PATH = __name__


def _without_ucx_progress_thread(make_config: Any) -> Any:
    @functools.wraps(make_config)
    def make(*args: Any, **kwargs: Any) -> Any:
        if "backends" not in kwargs:  # vLLM's UCX-only branch; other backends pass their list
            kwargs.setdefault("enable_prog_thread", False)
        return make_config(*args, **kwargs)

    make.rld_patched = True
    return make


if _worker.nixl_agent_config is not None and not getattr(_worker.nixl_agent_config, "rld_patched", False):
    _worker.nixl_agent_config = _without_ucx_progress_thread(_worker.nixl_agent_config)
