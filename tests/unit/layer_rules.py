"""omni's import layering: the rules and their checker, run by tests/unit/test_layers.py
(every omni/**/*.py parsed with `ast`, nothing imported).

docs/architecture.md explains the layers. In short: a module may import only from its own
package or from a lower layer; two packages on the same layer do not import each other; nothing
in omni/ imports the top-level `stages` package (adapters are found through omni.registry's
"module:attr" strings, which are not imports); and omni's modules have no import cycle.
Also checked: the third-party rules below (omni.core: stdlib, numpy, xxhash only; the torch-free
units import no torch), every omni module is in the table, and every `from omni... import name`
names an existing module or a name that module binds (a broken import after a move).

What counts as an import:
- every `import` / `from ... import` statement anywhere in a file, inside functions too;
- `from omni.x import y` names the module omni.x.y when that file exists, else omni.x;
- relative imports are resolved against the importing module's package;
- imports under `if TYPE_CHECKING:` count for the layer rule (a type-only dependency on a higher
  layer is still a dependency) but not for cycles nor for the third-party rules (they never run);
- dynamic imports (importlib with a string) are not imports.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

# --- the layer table: edit here (and in docs/architecture.md) ---------------------------------
LAYERS: dict[str, int] = {
    "omni.core": 0,  # torch-free bookkeeping
    "omni.family": 0,  # torch-free model-family manifests (ModelFamily, AdapterSpec)
    "omni.audio": 1,  # leaf utility
    "omni.registry": 1,  # torch-free name -> adapter/processor registry
    "omni.config": 2,  # torch-free config schema, loading, validation
    "omni.messages": 3,  # every boundary type
    "omni.runtime": 4,  # model execution (runner, attention hook, output cache, sampler)
    "omni.engine": 5,  # StageEngine, GenerationEngine
    "omni.host": 6,  # StageHost: one stage's engine + loop thread
    "omni.backends": 7,  # local, ray
    "omni.driver": 8,  # Router, PipelineDriver
    "omni.entrypoints": 9,  # Omni, AsyncOmni, CLI, prompt processing
    "omni": 10,  # the package root (omni/__init__.py only): lazy re-exports
}
"""Unit -> layer, bottom (0) to top. A unit is a subpackage or a single-module package of omni;
the unit of a module is the longest key that is the module or a parent package of it."""

FORBIDDEN_PACKAGES = {"stages": "adapters are looked up through omni.registry's strings"}
"""Top-level packages no omni module may import, with the reason."""

ONLY_EXTERNAL: dict[str, frozenset[str]] = {
    "omni.core": frozenset({"numpy", "xxhash"}),
    "omni.audio": frozenset({"numpy"}),
    "omni.family": frozenset(),
}
"""Units that may import nothing but the standard library and these top-level packages."""

TORCH_PACKAGES = frozenset({"torch", "torchaudio", "torchvision", "transformers", "kernels"})
TORCH_FREE = frozenset({"omni.core", "omni.family", "omni.audio", "omni.registry", "omni.config"})
"""Units that must stay importable without torch (`omni validate` loads no model code)."""

EXTERNAL_LAYERS: dict[str, int] = {"kernels": LAYERS["omni.runtime"]}
"""Top-level first-party packages outside omni and the lowest layer allowed to import them."""
# ------------------------------------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Edge:
    source: str  # importing module, e.g. "omni.engine.stage_engine"
    path: str  # its file, relative to the repo
    target: str  # the module the import names: "omni.driver.router", "torch.nn", "stages"
    name: str | None  # `from target import name` where name is not a submodule, else None
    line: int
    type_checking: bool


def module_sources(root: Path) -> dict[str, tuple[str, str]]:
    """Module name -> (path relative to `root`'s parent, source) for every .py file in `root`."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent)
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = (rel.as_posix(), path.read_text())
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.AST) -> Iterable[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement in `tree` with whether it sits under `if TYPE_CHECKING:`."""
    stack: list[tuple[ast.AST, bool]] = [(tree, False)]
    while stack:
        node, tc = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, tc
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            stack += [(child, True) for child in node.body]
            stack += [(child, tc) for child in node.orelse]
        else:
            stack += [(child, tc) for child in ast.iter_child_nodes(node)]


def bound_names(tree: ast.Module) -> set[str] | None:
    """The names a module binds at top level (None when it has `import *`: unknown). A module
    with `__getattr__` is taken to also provide every string constant it contains."""
    names: set[str] = set()
    stack: list[ast.stmt] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                if alias.name == "*":
                    return None
                names.add(alias.asname or alias.name.split(".")[0])
        else:  # if / try / with / for / while at top level: their bodies bind names too
            for field in ("body", "orelse", "finalbody", "handlers"):
                stack += getattr(node, field, [])
    if "__getattr__" in names:
        names |= {
            n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and type(n.value) is str
        }
    return names


def import_edges(trees: Mapping[str, tuple[str, ast.Module]]) -> list[Edge]:
    """The modules each module imports. Targets inside `trees` resolve to the exact module
    (`from omni.x import y` -> omni.x.y when that module exists); others stay as written."""
    edges = []
    for module, (path, tree) in trees.items():
        package = module if Path(path).name == "__init__.py" else module.rpartition(".")[0]
        for node, tc in _import_nodes(tree):
            if isinstance(node, ast.Import):
                targets = [(alias.name, None) for alias in node.names]
            else:
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                # `from pkg import y`: y is a submodule when such a module exists.
                targets = [
                    (f"{base}.{a.name}", None) if f"{base}.{a.name}" in trees else (base, a.name)
                    for a in node.names
                ]
            for target, name in targets:
                edges.append(Edge(module, path, target, name, node.lineno, tc))
    return sorted(edges, key=lambda e: (e.path, e.line))


def unit_of(module: str) -> str | None:
    """The LAYERS key a module belongs to, or None when the table does not cover it."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        if key in LAYERS:
            # "omni" covers only the package root: omni.newthing must be added to the table.
            return key if key != "omni" or module == "omni" else None
    return None


def find_cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of `graph` that contain a cycle, each as one concrete
    cycle path (first module repeated at the end), found with Tarjan's algorithm."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []

    def strongconnect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, ()):
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)

    cycles = []
    for component in sorted(components):
        members = set(component)
        # Shortest path back to the component's first module, inside the component (BFS).
        start = component[0]
        parents: dict[str, str] = {}
        frontier = [start]
        found = None
        while frontier and found is None:
            nxt = []
            for v in frontier:
                for w in sorted(graph.get(v, ())):
                    if w == start:
                        found = v
                        break
                    if w in members and w not in parents:
                        parents[w] = v
                        nxt.append(w)
                if found is not None:
                    break
            frontier = nxt
        path = [start]
        v = found
        while v is not None and v != start:
            path.insert(1, v)
            v = parents.get(v)
        cycles.append(path + [start])
    return cycles


def check(sources: Mapping[str, tuple[str, str]]) -> list[str]:
    """Every layering problem in `sources` (module -> (path, text)), one readable line each."""
    trees = {m: (path, ast.parse(text, filename=path)) for m, (path, text) in sources.items()}
    provided = {m: bound_names(tree) for m, (_, tree) in trees.items()}
    problems = []
    graph: dict[str, set[str]] = {m: set() for m in sources}
    for module, (path, _) in sources.items():
        if module.split(".")[0] == "omni" and unit_of(module) is None:
            problems.append(f"{path}: module {module} is in no layer (add it to LAYERS)")
    for e in import_edges(trees):
        top = e.target.split(".")[0]
        where = f"{e.path}:{e.line} imports {e.target}"
        src_unit = unit_of(e.source)
        if top in FORBIDDEN_PACKAGES:
            problems.append(f"{where}: forbidden ({FORBIDDEN_PACKAGES[top]})")
        elif top == "omni":
            if e.target not in sources:
                problems.append(f"{where}: no such module in omni/")
                continue
            names = provided[e.target]
            if e.name is not None and names is not None and e.name not in names:
                problems.append(f"{where}: it has no module or name {e.name!r}")
            if not e.type_checking and e.target != e.source:
                graph[e.source].add(e.target)
            dst_unit = unit_of(e.target)
            if src_unit is None or dst_unit is None or src_unit == dst_unit:
                continue
            src, dst = LAYERS[src_unit], LAYERS[dst_unit]
            short = f"{src_unit.removeprefix('omni.')} -> {dst_unit.removeprefix('omni.')}"
            if dst > src:
                problems.append(f"{where}: upward ({short})")
            elif dst == src:
                problems.append(f"{where}: same layer, different package ({short})")
        elif src_unit is not None and not e.type_checking and top not in sys.stdlib_module_names:
            allowed = ONLY_EXTERNAL.get(src_unit)
            if allowed is not None and top not in allowed:
                problems.append(
                    f"{where}: {src_unit} may import only the standard library and "
                    f"{', '.join(sorted(allowed))}"
                )
            elif src_unit in TORCH_FREE and top in TORCH_PACKAGES:
                problems.append(f"{where}: {src_unit} must stay torch-free")
            elif top in EXTERNAL_LAYERS and LAYERS[src_unit] < EXTERNAL_LAYERS[top]:
                problems.append(f"{where}: upward ({src_unit.removeprefix('omni.')} -> {top})")
    for cycle in find_cycles(graph):
        problems.append(f"import cycle: {' -> '.join(cycle)}")
    return list(dict.fromkeys(problems))  # one line per problem, not per imported name


def _fmt(problems: list[str]) -> str:
    return f"{len(problems)} layering problem(s) (see docs/architecture.md):\n" + "\n".join(
        f"  {p}" for p in problems
    )
