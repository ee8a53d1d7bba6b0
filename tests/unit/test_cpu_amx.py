"""CPU engines ask for AMX in each vLLM worker (serve_app/engine/cpu.py): without it vLLM's bfloat16 CPU
attention died with SIGILL on AMX machines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from devstack.serve_config import local_app_args
from serve_app.config import AppConfig
from serve_app.llm_configs import CPU_WORKER_EXTENSION, engine_kwargs

ROOT = Path(__file__).resolve().parents[2]

# a fresh process (the permission is per process): import the extension as vLLM's worker does, then read back
# what the kernel granted (arch_prctl ARCH_GET_XCOMP_PERM, bit 18 = AMX tile data)
PROBE = """
import ctypes, json, torch
import importlib
module, _, cls = {ext!r}.rpartition(".")
ext = getattr(importlib.import_module(module), cls)
libc = ctypes.CDLL(None, use_errno=True)
perm = ctypes.c_ulong(0)
rc = libc.syscall(158, 0x1022, ctypes.byref(perm))
print(json.dumps({{"advertised": torch.cpu._is_amx_tile_supported(), "granted": importlib.import_module(module).AMX_GRANTED,
                  "tile_data_permitted": rc == 0 and bool(perm.value >> 18 & 1)}}))
"""


def test_cpu_engines_get_the_worker_extension_and_a_users_own_wins() -> None:
    cpu = AppConfig.model_validate(local_app_args("/models/tiny"))
    assert cpu.accelerator == "cpu"
    role = cpu.prefill
    assert engine_kwargs(cpu, "prefill", role)["worker_extension_cls"] == CPU_WORKER_EXTENSION
    mine = role.model_copy(update={"engine_args": {"worker_extension_cls": "my.Extension"}})
    assert engine_kwargs(cpu, "prefill", mine)["worker_extension_cls"] == "my.Extension"
    gpu = cpu.model_copy(update={"accelerator": "gpu"})
    assert "worker_extension_cls" not in engine_kwargs(gpu, "decode", gpu.decode)


def test_importing_the_extension_asks_the_kernel_for_amx() -> None:
    import json

    out = subprocess.run([sys.executable, "-c", PROBE.format(ext=CPU_WORKER_EXTENSION)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, check=True).stdout
    seen = json.loads(out.strip().splitlines()[-1])
    if not seen["advertised"]:
        assert seen["granted"] is None  # nothing to ask on a CPU without AMX
    else:
        assert seen["granted"] is True and seen["tile_data_permitted"], seen
