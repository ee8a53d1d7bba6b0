"""The tree is self-contained: nothing in it names a file a clone does not have.

Checks every tracked text file: no reference to places outside the repository (the team's private
notes folder, a particular machine's paths), every Markdown link resolves, and every backticked
repo path (`dir/file.ext`) exists relative to the repo root or to the file that names it.
Needs only the standard library and git.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BINARY = {".png", ".gz", ".jpg", ".ico", ".whl", ".xz"}
# Places outside the tree that earlier revisions pointed at (spelled in pieces so this file passes itself).
OUTSIDE = [
    re.compile(re.escape(p))
    for p in ("shared" + "/notes", "../" + "shared", ".notes" + "-for", "/work" + "/", "KINDS" + ".md", ".lib" + "rary/")
]
MD_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
BACKTICKED_PATH = re.compile(r"`((?:\.\./|[A-Za-z0-9_])[A-Za-z0-9_./-]*/[A-Za-z0-9_.-]+\.(?:md|py|sh|yaml|yml|json|tpl|txt|toml|env))`")


def tracked_text_files() -> list[Path]:
    names = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    return [ROOT / n for n in names if Path(n).suffix not in BINARY and (ROOT / n).is_file()]


FILES = tracked_text_files()


def _exists(ref: str, source: Path) -> bool:
    return (source.parent / ref).exists() or (ROOT / ref).exists()


def test_no_file_points_outside_the_repository() -> None:
    hits = []
    for path in FILES:
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            hits += [f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}" for p in OUTSIDE if p.search(line)]
    assert not hits, "references to files a clone does not have:\n" + "\n".join(hits)


@pytest.mark.parametrize("kind", ["markdown links", "backticked paths"])
def test_every_named_repo_file_exists(kind: str) -> None:
    pattern = MD_LINK if kind == "markdown links" else BACKTICKED_PATH
    missing = []
    for path in FILES:
        if kind == "markdown links" and path.suffix != ".md":
            continue
        for ref in pattern.findall(path.read_text(errors="replace")):
            if "://" in ref or ref.startswith(("mailto:", "/")) or "<" in ref or "*" in ref:
                continue
            if not _exists(ref, path):
                missing.append(f"{path.relative_to(ROOT)}: {ref}")
    assert not missing, f"{kind} to files that do not exist:\n" + "\n".join(missing)


def test_the_readme_key_table_names_real_chart_values() -> None:
    """The top README's table of the keys most setups change names keys values.yaml really has."""
    import yaml

    values = yaml.safe_load((ROOT / "charts/ray-llm-disagg/values.yaml").read_text())
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("| key | what it sets |"):].split("\n\n", 1)[0]
    keys = [k for row in table.splitlines()[2:] for k in re.findall(r"`([^`]+)`", row.split("|")[1])]
    assert keys, "README key table not found or empty"
    missing = []
    for key in keys:
        node = values
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                missing.append(key)
                break
            node = node[part]
    assert not missing, f"README key table names keys values.yaml lacks: {missing}"
