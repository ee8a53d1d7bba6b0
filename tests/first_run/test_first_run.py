"""A newcomer's first run, as the README's quick start has it.

`make demo` from a fresh copy of the tree with an empty cache directory must reach READY on its first
run. That run builds the Python env and the tiny model from nothing, so it also proves what broke the
first demo once: scripts whose stdout another script captures (`$(hack/pyenv.sh python)`) print the
value alone, whatever a cold build writes along the way. The warm checks below cover the other
value-printing commands.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from devstack.ports import TESTS_FIRST_RUN

ROOT = Path(__file__).resolve().parents[2]
DEMO_TIMEOUT_S = 1800  # cold venv (2-6 min) + tiny model + Ray + engines on a busy 2-core machine


def fresh_copy(dest: Path) -> Path:
    """The tree as a clone would have it (tracked and untracked-but-not-ignored files), without caches."""
    names = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split("\n")
    for name in filter(None, names):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.e2e
@pytest.mark.slow
def test_make_demo_reaches_ready_on_its_first_run_from_an_empty_cache(tmp_path: Path) -> None:
    repo = fresh_copy(tmp_path / "clone")
    cache = tmp_path / "cache"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLD_", "VIRTUAL_ENV", "PYTHONPATH"))}
    env["RLD_CACHE"] = str(cache)  # empty: the env and the model are built by this run
    # Only the interpreter's own folder from the caller's PATH would hide a missing install step: drop the venv.
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if "venv-" not in p)
    args = f"--exit-when-ready --port {TESTS_FIRST_RUN.http} --port-base {TESTS_FIRST_RUN.base}"
    started = time.time()
    try:
        demo = run(["make", "demo", f"DEMO_ARGS={args}"], repo, env, timeout=DEMO_TIMEOUT_S)
        tail = f"stdout:\n{demo.stdout[-2000:]}\nstderr:\n{demo.stderr[-6000:]}"
        assert demo.returncode == 0, f"make demo failed on its first run (exit {demo.returncode})\n{tail}"
        assert re.search(rf"^READY disaggregated model=tiny at http://127\.0\.0\.1:{TESTS_FIRST_RUN.http}/v1 ",
                         demo.stdout, re.M), tail
        assert "none left" in demo.stderr, f"the demo left processes behind\n{tail}"
        markers = list(cache.glob("venv-*/.rld-complete"))
        assert len(markers) == 1 and markers[0].stat().st_mtime >= started, "the env was not built by this run"

        # Now warm: the same commands print the value alone as well.
        python = run(["hack/pyenv.sh", "python"], repo, env)
        assert python.returncode == 0 and python.stdout == f"{markers[0].parent}/bin/python\n", python.stdout
    finally:
        shutil.rmtree(cache, ignore_errors=True)  # ~7 GB


def _one_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert len(lines) == 1, f"expected one line on stdout, got {len(lines)}:\n{result.stdout[:2000]}"
    return lines[0]


def test_value_printing_commands_print_the_value_alone(tmp_path: Path) -> None:
    python = _one_line(run(["hack/pyenv.sh", "python"], ROOT))
    assert Path(python).is_file() and python.endswith("/bin/python")
    assert _one_line(run(["hack/pyenv.sh", "path"], ROOT)) == str(Path(python).parents[1])
    assert re.fullmatch(r"[0-9a-f]{12}", _one_line(run(["hack/pyenv.sh", "hash"], ROOT)))
    for cmd in (["hack/toolchain.sh", "env"], ["hack/cluster.sh", "env"]):
        out = run(cmd, ROOT)
        assert out.returncode == 0 and out.stdout.strip(), out.stderr
        assert all(line.startswith("export ") for line in out.stdout.splitlines()), out.stdout
    tools = run(["hack/toolchain.sh", "list"], ROOT)
    assert tools.returncode == 0 and all(re.fullmatch(r"[a-z0-9-]+", t) for t in tools.stdout.split())

    # The tiny model's path, cold (it builds) and warm, into an empty cache.
    env = dict(os.environ, RLD_CACHE=str(tmp_path / "cache"))
    cold = _one_line(run([sys.executable, "-m", "devstack.tiny_model"], ROOT, env, timeout=300))
    warm = _one_line(run([sys.executable, "-m", "devstack.tiny_model"], ROOT, env))
    assert cold == warm and (Path(cold) / "config.json").is_file()
