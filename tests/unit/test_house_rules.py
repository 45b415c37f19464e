"""House rules as tests: files stay small (one concept per file), docs/architecture.md's file
table names every module of omni/, stages/ and kernels/ (and nothing that is gone), and one
concept has one name in omni/ and stages/ (retired spellings do not come back).

The import layering is checked by tests/unit/test_layers.py; markers by pytest's
--strict-markers (pyproject.toml); annotations by mypy (`make test`)."""

from __future__ import annotations

import ast
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

NAMED = ("omni", "stages")
"""Folders whose code keeps one name per concept (the retired spellings below)."""

RETIRED = {
    "stream_steps": "step_snapshots",
    "stream_outputs": "step_rows",
    "rid": "request_id",
    "rids": "request_ids",
}
"""Identifiers replaced by the one name of their concept (docs/streaming.md, "Names"), anywhere:
a variable, attribute, parameter or keyword."""

RETIRED_MEMBERS = {"streaming": "input_complete"}
"""Names retired as an attribute, parameter or keyword only: a bare name may be a module
(omni.entrypoints.openai.streaming)."""

RETIRED_BOOLS = {"stream": "stream_audio"}
"""Names retired for a bool (a parameter or field annotated bool, or a keyword): `stream` stays
free for a CUDA stream and the stage config's StreamConfig."""

FOREIGN = {"omni/entrypoints/openai/protocol.py": "OpenAI's request fields (`stream: true`)"}
"""Files that spell another API's names, to which RETIRED_BOOLS does not apply."""

RETIRED_HANDLES = {("omni/entrypoints", "engine"): "async_omni"}
"""(folder, attribute): in that folder `self.<attribute>` / `ctx.<attribute>` names an AsyncOmni,
which is called async_omni (an engine is a stage's StageEngine)."""

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


def _bindings(node: ast.AST) -> list[tuple[str, ast.expr | None, bool]]:
    """(name, annotation, is a call keyword) of a parameter, an annotated assignment target
    (a dataclass field) or a call keyword; nothing for other nodes."""
    if isinstance(node, ast.arg):
        return [(node.arg, node.annotation, False)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [(node.target.id, node.annotation, False)]
    if isinstance(node, ast.keyword) and node.arg is not None:
        return [(node.arg, None, True)]
    return []


def _retired_in(path: str, node: ast.AST) -> list[tuple[str, str]]:
    """(old, new) for each retired spelling `node` itself uses."""
    found = []
    if isinstance(node, ast.Name) and node.id in RETIRED:
        found.append((node.id, RETIRED[node.id]))
    if isinstance(node, ast.Attribute):
        found += [(node.attr, t[node.attr]) for t in (RETIRED, RETIRED_MEMBERS) if node.attr in t]
        owner = node.value.id if isinstance(node.value, ast.Name) else None
        for (folder, attr), new in RETIRED_HANDLES.items():
            if path.startswith(folder + "/") and node.attr == attr and owner in ("self", "ctx"):
                found.append((f"{owner}.{attr}", new))
    for name, annotation, keyword in _bindings(node):
        found += [(name, t[name]) for t in (RETIRED, RETIRED_MEMBERS) if name in t]
        is_bool = annotation is not None and "bool" in ast.unparse(annotation)
        if name in RETIRED_BOOLS and (keyword or is_bool) and path not in FOREIGN:
            found.append((name, RETIRED_BOOLS[name]))
    return found


def retired_spellings(root: Path, folders: tuple[str, ...]) -> list[str]:
    """'path:line: old (use new)' for every retired spelling in the .py files of `folders`."""
    problems = set()
    for folder in folders:
        for path in python_files(root, folder):
            for node in ast.walk(ast.parse((root / path).read_text(), filename=path)):
                for old, new in _retired_in(path, node):
                    problems.add((path, getattr(node, "lineno", 0), f"{old} (use {new})"))
    return [f"{path}:{line}: {what}" for path, line, what in sorted(problems)]


def look_alike_modules(root: Path, folders: tuple[str, ...]) -> list[str]:
    """Sibling modules whose names differ only by a trailing s (processor.py, processors.py):
    two concepts that a reader cannot tell apart by name."""
    out = []
    for folder in folders:
        names = set(python_files(root, folder))
        for path in sorted(names):
            if path.endswith("s.py") and path[: -len("s.py")] + ".py" in names:
                out.append(f"{path[: -len('s.py')]}.py and {path}")
    return out


def test_no_file_over_its_line_limit():
    assert (REPO / "omni" / "host" / "stage_host.py").exists(), "repo not found"
    problems = oversized(REPO, MAX_LINES)
    assert not problems, "split these by concept:\n" + "\n".join(problems)


def test_every_module_has_a_row_in_the_architecture_file_table():
    problems = table_problems(REPO, ARCHITECTURE.read_text(), TABLED)
    assert not problems, "\n".join(problems)


def test_one_name_per_concept():
    assert (REPO / "omni" / "entrypoints" / "omni.py").exists(), "repo not found"
    problems = retired_spellings(REPO, NAMED) + look_alike_modules(REPO, NAMED + ("kernels",))
    assert not problems, "retired names (docs/streaming.md, Names):\n" + "\n".join(problems)


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


def test_naming_checks_find_each_retired_spelling(tmp_path):
    (tmp_path / "omni" / "entrypoints").mkdir(parents=True)
    (tmp_path / "omni" / "entrypoints" / "old.py").write_text(
        "from omni.entrypoints.openai import streaming\n"  # a module: allowed
        "def f(rid, stream: bool, cuda_stream=None, stream_steps=True):\n"
        "    x = run(streaming=True, stream=True)\n"
        "    streaming.sse(x.streaming, x.stream_outputs)\n"
        "    return self.engine, ctx.engine, config.engine, torch.cuda.stream(s)\n"
    )
    (tmp_path / "omni" / "host.py").write_text("def g(self):\n    return self.engine\n")
    (tmp_path / "stages" / "fam").mkdir(parents=True)
    for name in ("processor.py", "processors.py", "prompt_processor.py"):
        (tmp_path / "stages" / "fam" / name).write_text("stream: Stream = None\n")
    assert retired_spellings(tmp_path, ("omni", "stages")) == [
        "omni/entrypoints/old.py:2: rid (use request_id)",
        "omni/entrypoints/old.py:2: stream (use stream_audio)",
        "omni/entrypoints/old.py:2: stream_steps (use step_snapshots)",
        "omni/entrypoints/old.py:3: stream (use stream_audio)",
        "omni/entrypoints/old.py:3: streaming (use input_complete)",
        "omni/entrypoints/old.py:4: stream_outputs (use step_rows)",
        "omni/entrypoints/old.py:4: streaming (use input_complete)",
        "omni/entrypoints/old.py:5: ctx.engine (use async_omni)",
        "omni/entrypoints/old.py:5: self.engine (use async_omni)",
    ]
    assert look_alike_modules(tmp_path, ("omni", "stages")) == [
        "stages/fam/processor.py and stages/fam/processors.py"
    ]
