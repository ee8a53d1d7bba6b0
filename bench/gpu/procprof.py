"""Where the serving processes spend their CPU during one ladder step: CPU use per process and py-spy stacks.

`StepProfile(procs, out, tag, delay_s, seconds).start()` waits `delay_s` (the ladder's ramp), then for
`seconds` measures every given process's CPU time (psutil: cores used = CPU seconds / wall seconds) and
samples the Python ones with `py-spy record --nonblocking` (collapsed stacks, idle threads left out, so a
sample is a thread running Python or native code called from it). `result()` gives per process: cores,
py-spy samples, the hottest self frames and the functions with the most inclusive samples, and a
breakdown of the samples by the package of the innermost frame. Collapsed stacks stay in `out` for
flamegraph tools. `ClientCpu` samples the load generators' CPU the same way, for the whole step.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Optional

import psutil

# process title (joined cmdline) -> label; first match wins
LABELS = (
    (r"ray::ServeReplica:[^:\s]+:([^:\s]+)", "replica:{0}"),
    (r"^VLLM::EngineCore", "engine_core"),
    (r"ray::RayWorkerWrapper|ray::RayWorkerProc|VLLM::Worker", "gpu_worker"),
    (r"vllm\.entrypoints\.openai\.api_server", "api_server"),
    (r"ray::ProxyActor", "serve_proxy"),
    (r"ray::ServeController", "serve_controller"),
    (r"(^|/)haproxy(\s|$)", "haproxy"),
    (r"(^|/)raylet(\s|$)", "raylet"),
    (r"(^|/)gcs_server(\s|$)", "gcs_server"),
)
PYTHON_LABELS = re.compile(r"^(replica:|engine_core$|gpu_worker$|api_server$|serve_proxy$)")
# innermost-frame file path -> component, first match wins (for the breakdown of samples)
COMPONENTS = (
    ("vllm/v1/metrics", "vllm metrics"),
    ("ray/util/metrics", "ray metrics"),
    ("vllm/v1/engine/output_processor", "vllm output processor"),
    ("detokenizer", "detokenizer"),
    ("tokenizers", "detokenizer"),
    ("vllm/entrypoints", "vllm openai serving"),
    ("vllm/v1/engine", "vllm engine client"),
    ("vllm/", "vllm other"),
    ("pydantic", "pydantic"),
    ("serve_app/", "serve_app"),
    ("ray/llm/", "ray llm"),
    ("ray/serve/", "ray serve"),
    ("ray/_private", "ray core (python)"),
    ("_raylet", "ray core (python)"),
    ("ray/", "ray other"),
    ("starlette/", "asgi (starlette/fastapi/uvicorn)"),
    ("fastapi/", "asgi (starlette/fastapi/uvicorn)"),
    ("uvicorn/", "asgi (starlette/fastapi/uvicorn)"),
    ("asyncio/", "asyncio"),
    ("uvloop", "asyncio"),
    ("json", "json"),
    ("torch/", "torch"),
    ("zmq", "zmq"),
    ("msgspec", "msgspec"),
    ("logging/", "logging"),
)


def label(cmdline: str) -> Optional[str]:
    for pattern, fmt in LABELS:
        m = re.search(pattern, cmdline)
        if m:
            return fmt.format(*m.groups())
    return None


def labelled(procs: Iterable[psutil.Process]) -> dict[str, psutil.Process]:
    """{label: process} for the processes worth measuring (a label seen twice gets `#pid`)."""
    found: dict[str, psutil.Process] = {}
    for p in procs:
        try:
            name = label(" ".join(p.cmdline()) or p.name())
        except psutil.Error:
            continue
        if name is None:
            continue
        found[f"{name}#{p.pid}" if name in found else name] = p
    return found


def py_spy() -> Optional[str]:
    """py-spy: on PATH, beside this Python, or from the offline bundle (`py_spy_bin/` in a sys.path entry)."""
    found = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if found:
        return found
    for entry in sys.path:
        candidate = Path(entry or ".") / "py_spy_bin" / "py-spy"
        if candidate.is_file():
            candidate.chmod(0o755)
            return str(candidate)
    return None


def component(frame: str) -> str:
    for needle, name in COMPONENTS:
        if needle in frame:
            return name
    return "other"


def _function(frame: str) -> str:
    """`name (path/to/file.py:123)` -> `name (file.py)`: lines folded, for inclusive counts."""
    m = re.match(r"^(.*?) \((.*?)(?::\d+)?\)$", frame)
    if not m:
        return frame
    return f"{m.group(1)} ({'/'.join(m.group(2).rsplit('/', 2)[-2:])})"


def summarize_collapsed(text: str, top: int = 25) -> dict[str, Any]:
    """Self frames, inclusive functions and components of py-spy's collapsed (raw) output."""
    self_counts: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    parts: Counter[str] = Counter()
    total = 0
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        total += n
        self_counts[frames[-1]] += n
        parts[component(frames[-1])] += n
        for fn in {_function(f) for f in frames}:
            inclusive[fn] += n
    share = (lambda c: round(c / total, 4)) if total else (lambda c: 0.0)
    return {
        "samples": total,
        "self": [[f, share(c)] for f, c in self_counts.most_common(top)],
        "inclusive": [[f, share(c)] for f, c in inclusive.most_common(top * 2)],
        "components": {k: share(c) for k, c in parts.most_common()},
    }


def _cpu(p: psutil.Process) -> Optional[float]:
    try:
        t = p.cpu_times()
        return t.user + t.system
    except psutil.Error:
        return None


class StepProfile:
    """CPU use of `procs` and py-spy samples of the Python ones, `seconds` long, starting `delay_s` from now."""

    def __init__(self, procs: dict[str, psutil.Process], out: Path, tag: str, *, delay_s: float, seconds: float,
                 rate_hz: int = 67) -> None:
        self.procs, self.out, self.tag = procs, out, tag
        self.delay_s, self.seconds, self.rate_hz = delay_s, seconds, rate_hz
        self._result: dict[str, Any] = {}
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "StepProfile":
        self._thread.start()
        return self

    def result(self, timeout: float = 120) -> dict[str, Any]:
        self._thread.join(timeout)
        return self._result

    def _run(self) -> None:
        time.sleep(self.delay_s)
        spy = py_spy()
        spies = []
        before = {name: _cpu(p) for name, p in self.procs.items()}
        t0 = time.monotonic()
        for name, p in self.procs.items():
            if spy and PYTHON_LABELS.match(name.split("#", 1)[0]):
                dest = self.out / f"pyspy-{self.tag}-{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}.txt"
                spies.append((name, dest, subprocess.Popen(
                    [spy, "record", "--pid", str(p.pid), "--duration", str(int(self.seconds)), "--rate",
                     str(self.rate_hz), "--format", "raw", "--nonblocking", "--output", str(dest)],
                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)))
        time.sleep(self.seconds)
        after = {name: _cpu(p) for name, p in self.procs.items()}
        wall = time.monotonic() - t0
        result: dict[str, Any] = {"seconds": round(wall, 1), "py_spy": spy, "processes": {}}
        for name, p in self.procs.items():
            b, a = before[name], after[name]
            result["processes"][name] = {"pid": p.pid, "cores": round((a - b) / wall, 3) if a is not None and b is not None else None}
        for name, dest, proc in spies:
            try:
                _, err = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
            entry = result["processes"][name]
            if dest.exists():
                entry.update(summarize_collapsed(dest.read_text(errors="replace")))
            if not entry.get("samples"):
                entry["py_spy_stderr"] = err.decode(errors="replace")[-500:]
        (self.out / f"profile-{self.tag}.json").write_text(json.dumps(result, indent=1))
        self._result = result


class ClientCpu:
    """CPU use of the load-generator processes over a step, sampled every `every_s`: the mean over the
    step and the largest `window_s` average of any one process (near 1.0: that client was the bottleneck)."""

    def __init__(self, pids: list[int], every_s: float = 1.0, window_s: float = 5.0) -> None:
        self.procs = []
        for pid in pids:
            try:
                self.procs.append(psutil.Process(pid))
            except psutil.Error:
                pass
        self.every_s, self.window_s = every_s, window_s
        self.samples: list[tuple[float, list[Optional[float]]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "ClientCpu":
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.monotonic(), [_cpu(p) for p in self.procs]))
            self._stop.wait(self.every_s)

    def stop(self) -> dict[str, Optional[float]]:
        self._stop.set()
        self._thread.join(5)
        return client_cpu_stats(self.samples, self.window_s)


def client_cpu_stats(samples: list[tuple[float, list[Optional[float]]]], window_s: float) -> dict[str, Optional[float]]:
    """`ClientCpu`'s figures from (time, [cpu seconds per process]) samples; a process that exited has None."""
    if len(samples) < 2:
        return {"mean_cores_per_client": None, "max_cores_per_client": None}
    n = len(samples[0][1])
    means, peak = [], 0.0
    for i in range(n):
        series = [(t, cpu[i]) for t, cpu in samples if cpu[i] is not None]
        if len(series) < 2:
            continue
        means.append((series[-1][1] - series[0][1]) / max(series[-1][0] - series[0][0], 1e-9))
        j = 0
        for k in range(len(series)):  # the shortest window of at least window_s ending at each sample
            while j + 1 <= k and series[k][0] - series[j + 1][0] >= window_s:
                j += 1
            span = series[k][0] - series[j][0]
            if span >= window_s:
                peak = max(peak, (series[k][1] - series[j][1]) / span)
    return {"mean_cores_per_client": round(sum(means) / len(means), 3) if means else None,
            "max_cores_per_client": round(peak, 3)}
