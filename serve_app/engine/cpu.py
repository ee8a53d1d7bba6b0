"""vLLM CPU engines on CPUs with AMX (Intel Sapphire Rapids and later): the worker must ask Linux for AMX first.

vLLM 0.29's CPU attention picks its AMX kernels for bfloat16 when the CPU advertises AMX
(`torch.cpu._is_amx_tile_supported()`, a CPUID check), but nothing in the worker process asks the kernel for
permission to use the AMX tile state (`arch_prctl(ARCH_REQ_XCOMP_PERM)`, `torch.cpu._init_amx()`). Unless
oneDNN happened to ask first, the first attention step dies with SIGILL on `tilezero` (seen on this project's
CI machines: "Worker proc VllmWorker-0 died unexpectedly", then "EngineCore encountered a fatal error", on the
prefill warm-up or the first KV transfer). The permission is per process and lost across exec, so it has to be
asked in each vLLM worker.

`AmxPermission` is a vLLM worker extension (`worker_extension_cls`): vLLM imports this module in every worker
process before it loads the model, and the import asks. The app sets it for CPU engines (llm_configs); the
tests' plain vLLM servers pass `--worker-extension-cls` too. On a CPU without AMX, or where the kernel refuses,
nothing changes (vLLM's check still says AMX; that case is vLLM's to fix, and the refusal is logged here).
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


def request_amx_permission() -> bool | None:
    """Ask for AMX in this process: True granted, False refused, None when the CPU has no AMX (or no torch)."""
    try:
        from serve_app.upstream import init_amx, is_amx_tile_supported
    except ImportError:
        return None
    if not is_amx_tile_supported():
        return None
    granted = bool(init_amx())
    if not granted:
        logger.warning(
            "this CPU advertises AMX but the kernel refused the AMX permission (arch_prctl ARCH_REQ_XCOMP_PERM): "
            "vLLM's bfloat16 CPU attention may die with SIGILL; serve with dtype float32 on this machine"
        )
    return granted


class AmxPermission:
    """A worker extension with no methods: importing its module asks for AMX in the worker (see the module's doc)."""


AMX_GRANTED = request_amx_permission()
