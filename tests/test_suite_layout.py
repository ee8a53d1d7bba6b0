"""The test tree's layout rules that fixtures depend on (see tests/__init__.py)."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).parent


def test_every_test_folder_is_a_package() -> None:
    """A folder without __init__.py turns its package-scoped fixtures into session-scoped ones: a suite's
    stack would keep running (CPU, memory, ports) while every later suite runs."""
    folders = {p.parent for p in TESTS.rglob("test_*.py")} | {p.parent for p in TESTS.rglob("conftest.py")}
    missing = sorted(str(f.relative_to(TESTS.parent)) for f in folders if not (f / "__init__.py").exists())
    assert not missing, f"test folders without __init__.py: {missing}"
