import ast
import itertools
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture(scope="session")
def qwen2_dir() -> str:
    from tools.make_tiny_checkpoint import ensure_checkpoint

    return str(ensure_checkpoint("qwen2", "tiny", 0))


@pytest.fixture(scope="session")
def llama_dir() -> str:
    from tools.make_tiny_checkpoint import ensure_checkpoint

    return str(ensure_checkpoint("llama", "tiny", 0))


@pytest.fixture(scope="module")
def omni_dir():
    """The tiny Qwen2.5-Omni checkpoint, with one torch thread for the module (see below)."""
    import torch

    from tools.make_tiny_checkpoint import ensure_checkpoint

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield str(ensure_checkpoint("qwen2_5_omni", "tiny"))
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models gain nothing from threads, and on a busy 2-core machine every OpenMP region
    waits for a descheduled peer thread (measured 10-50x slower with 2 threads under load)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def pytest_collection_modifyitems(config, items):
    """`cuda` tests run only where torch sees a GPU (CI has none: they show as skipped)."""
    # The marker, not the keyword: keywords include the path, and tests/cuda/test_tf32_off.py
    # runs everywhere.
    cuda_items = [item for item in items if item.get_closest_marker("cuda") is not None]
    if not cuda_items:
        return
    import torch

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is false)")
    else:
        # Each sizes its pools from the GPU's free memory (up to 0.9 of it) or holds part of
        # it: two workers running them at once starve each other (on an H200, 15 failures).
        workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
        if workers <= 1:
            return
        skip = pytest.mark.skip(
            reason=f"cuda tests share the GPU: run them in one process (`pytest -m cuda`, no "
            f"-n; `make test` does after its {workers} workers), not across {workers} workers"
        )
    for item in cuda_items:
        item.add_marker(skip)


# ---- modules -m deselects entirely: left out of collection, never imported ---------------------
# The server extras and Ray are dependencies, so every ordinary run imports the modules that use
# them and a missing one fails loudly. The GPU machine lacks them, and its `pytest -m cuda` over
# tests/ selects none of the modules that import them (directly, or through omni's server and
# Ray packages). So whenever -m deselects every test a module could hold (by the markers its
# source names), the module is not collected: it would contribute no test, and importing it
# could only fail.
MARKERS = ("cuda", "ray", "slow")
LEFT_OUT = pytest.StashKey[list]()


def _marks(node: ast.AST) -> set[str]:
    """Every `pytest.mark.NAME` (or `mark.NAME`) below node."""
    return {
        n.attr
        for n in ast.walk(node)
        if isinstance(n, ast.Attribute)
        and (
            (isinstance(n.value, ast.Attribute) and n.value.attr == "mark")
            or (isinstance(n.value, ast.Name) and n.value.id == "mark")
        )
    }


def _all_deselected(path: Path, markexpr: str) -> bool:
    """Whether -m deselects every test the module could hold."""
    from _pytest.mark.expression import Expression

    tree = ast.parse(path.read_text(), str(path))
    module_marks = set()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in targets):
            module_marks = _marks(node) & set(MARKERS)
    others = sorted((_marks(tree) & set(MARKERS)) - module_marks)
    expression = Expression.compile(markexpr)
    for size in range(len(others) + 1):  # a test has the module's marks and any of the others
        for extra in itertools.combinations(others, size):
            names = frozenset(module_marks | set(extra))
            if expression.evaluate(lambda name, /, names=names, **kwargs: name in names):
                return False
    return True


def pytest_ignore_collect(collection_path, config):
    markexpr = config.getoption("markexpr")
    if (
        not markexpr
        or collection_path.suffix != ".py"
        or not collection_path.name.startswith("test_")
        or not _all_deselected(collection_path, markexpr)
    ):
        return None
    config.stash.setdefault(LEFT_OUT, []).append(str(collection_path))
    return True


def pytest_terminal_summary(terminalreporter, config):
    left_out = config.stash.get(LEFT_OUT, [])
    if left_out:
        markexpr = config.getoption("markexpr")
        terminalreporter.write_line(
            f"{len(left_out)} test modules left out of collection (-m {markexpr!r} deselects "
            "all their tests)"
        )
