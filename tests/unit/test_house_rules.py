"""House rules as tests: files stay small (one concept per file), and docs/architecture.md's file
table names every module of omni/, stages/ and kernels/ (and nothing that is gone).

The import layering is checked by tests/unit/test_layers.py; markers by pytest's
--strict-markers (pyproject.toml); annotations by mypy (`make test`)."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

from tests.unit.layer_rules import REPO

MAX_LINES = {
    "omni": 300,
    "stages": 300,
    "kernels": 300,
    "tools": 300,
    "examples": 300,
    "tests": 400,
    "bench": 400,
}
"""Top-level folder -> the most lines a .py file in it may have. Past that a file holds more than
one concept: split it by concept (one per file, named for it), never by line count."""

TABLED = ("omni", "stages", "kernels", "stage_configs")
"""Folders whose every module has a row in docs/architecture.md's file table (and whose every row
there names a file: the YAML pipelines' row too)."""

ARCHITECTURE = REPO / "docs" / "architecture.md"
_ROW = re.compile(r"^\| `([^`]+)` \|", re.MULTILINE)


def python_files(root: Path, folder: str) -> list[str]:
    """The .py files under root/folder, as paths relative to root (caches left out)."""
    return sorted(
        p.relative_to(root).as_posix()
        for p in (root / folder).rglob("*.py")
        if "__pycache__" not in p.parts
    )


def oversized(root: Path, limits: dict[str, int]) -> list[str]:
    """'path: N lines (limit L)' for every .py file over its folder's limit."""
    out = []
    for folder, limit in limits.items():
        for path in python_files(root, folder):
            num_lines = len((root / path).read_text().splitlines())
            if num_lines > limit:
                out.append(f"{path}: {num_lines} lines (limit {limit})")
    return out


def table_problems(root: Path, table: str, folders: tuple[str, ...]) -> list[str]:
    """Modules of `folders` without a row in `table` (rows start "| `path` |", a path may be a
    glob), and rows that name no file."""
    rows = _ROW.findall(table)
    problems = [
        f"{path}: no row in docs/architecture.md's file table"
        for folder in folders
        for path in python_files(root, folder)
        if path not in rows
    ]
    for row in rows:
        if row.split("/")[0] in folders and not any(
            fnmatch.fnmatch(p.relative_to(root).as_posix(), row)
            for p in (root / row.split("/")[0]).rglob("*")
        ):
            problems.append(f"{row}: a row in docs/architecture.md for no file")
    return problems


def test_no_file_over_its_line_limit():
    assert (REPO / "omni" / "host" / "stage_host.py").exists(), "repo not found"
    problems = oversized(REPO, MAX_LINES)
    assert not problems, "split these by concept:\n" + "\n".join(problems)


def test_every_module_has_a_row_in_the_architecture_file_table():
    problems = table_problems(REPO, ARCHITECTURE.read_text(), TABLED)
    assert not problems, "\n".join(problems)


# ---- the checks themselves, on a synthetic tree --------------------------------------------------


def test_checks_report_long_files_missing_rows_and_stale_rows(tmp_path):
    (tmp_path / "omni" / "sub").mkdir(parents=True)
    (tmp_path / "omni" / "small.py").write_text("x = 1\n" * 3)
    (tmp_path / "omni" / "sub" / "big.py").write_text("x = 1\n" * 4)
    (tmp_path / "omni" / "data.yaml").write_text("a: 1\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "t.py").write_text("x = 1\n" * 4)
    assert oversized(tmp_path, {"omni": 3, "tests": 4}) == ["omni/sub/big.py: 4 lines (limit 3)"]
    table = (
        "| file | concept |\n|---|---|\n| `omni/small.py` | a |\n| `omni/gone.py` | b |\n"
        "| `omni/*.yaml` | c |\n| `omni/*.json` | d |\n| `docs/x.md` | elsewhere: not checked |\n"
    )
    assert table_problems(tmp_path, table, ("omni",)) == [
        "omni/sub/big.py: no row in docs/architecture.md's file table",
        "omni/gone.py: a row in docs/architecture.md for no file",
        "omni/*.json: a row in docs/architecture.md for no file",
    ]


def test_markers_and_annotations_are_enforced_by_config():
    """--strict-markers (an unknown marker fails collection instead of silently selecting
    nothing), and mypy over omni/ and stages/ with every function annotated."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "--strict-markers" in config["tool"]["pytest"]["ini_options"]["addopts"].split()
    mypy = config["tool"]["mypy"]
    assert {"omni", "stages"} <= set(mypy["files"])
    assert mypy["disallow_untyped_defs"] is True and mypy["disallow_incomplete_defs"] is True
    skipped = {
        m for o in mypy["overrides"] if o.get("follow_imports") == "skip" for m in o["module"]
    }
    assert not {"omni", "omni.*", "stages", "stages.*"} & skipped
