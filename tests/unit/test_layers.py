"""omni's import layering (the rules and the checker: tests/unit/layer_rules.py), and tests of the
checker itself on synthetic packages."""

from __future__ import annotations

from tests.unit.layer_rules import (
    REPO,
    _fmt,
    check,
    find_cycles,
    module_sources,
)


def test_omni_layering():
    sources = module_sources(REPO / "omni")
    assert "omni.core.request" in sources, "omni/ not found"
    problems = check(sources)
    assert not problems, _fmt(problems)


# --- the checker itself, on synthetic packages ---------------------------------------------------


def _pkg(files: dict[str, str]) -> dict[str, tuple[str, str]]:
    """{"omni/core/a.py": source} -> the `sources` mapping `check` takes."""
    out = {}
    for path, text in files.items():
        parts = path.removesuffix(".py").split("/")
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = (path, text)
    return out


def test_checker_accepts_downward_and_same_package_imports():
    sources = _pkg(
        {
            "omni/__init__.py": "def __getattr__(n):\n    from omni.entrypoints import cli\n",
            "omni/core/__init__.py": "from omni.core.a import A\n",
            "omni/core/a.py": "import struct\nimport numpy as np\nA = 1\n",
            "omni/engine/__init__.py": "from .stage_engine import E\n",
            "omni/engine/stage_engine.py": (
                "import torch\nfrom omni.core import a\nfrom omni.engine.engine import X\n"
                "from .. import messages\nfrom omni.runtime.runner import R\nE = 1\n"
            ),
            "omni/engine/engine.py": "X = 1\n",
            "omni/messages.py": "from omni.core.a import A\n",
            "omni/runtime/runner.py": "import kernels.ops\nR = 1\n",
            "omni/entrypoints/cli.py": "from omni.engine import E\n",
            "omni/registry.py": "TABLE = {'x': 'stages.causal_lm:Adapter'}\n",
        }
    )
    assert check(sources) == []


def test_checker_reports_upward_edges():
    sources = _pkg(
        {
            "omni/engine/stage_engine.py": "from omni.driver.router import Router\n",
            "omni/driver/router.py": "Router = 1\n",
            "omni/core/request.py": (
                "def f():\n    from omni.messages import M\n\n"
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import omni.runtime\n"
            ),
            "omni/messages.py": "M = 1\n",
            "omni/runtime/__init__.py": "",
            "omni/audio.py": "from omni import registry\n",
            "omni/registry.py": "",
        }
    )
    assert sorted(check(sources)) == [
        "omni/audio.py:1 imports omni.registry: same layer, different package (audio -> registry)",
        "omni/core/request.py:2 imports omni.messages: upward (core -> messages)",
        "omni/core/request.py:6 imports omni.runtime: upward (core -> runtime)",
        "omni/engine/stage_engine.py:1 imports omni.driver.router: upward (engine -> driver)",
    ]


def test_checker_reports_forbidden_and_third_party_imports():
    sources = _pkg(
        {
            "omni/engine/engine.py": "from stages import registry\n",
            "omni/core/a.py": "import torch\nimport numpy\n",
            "omni/config/schema.py": "import yaml\n\ndef f():\n    import transformers\n",
            "omni/messages.py": "import kernels\nfrom omni import Omni\n",
            "omni/__init__.py": "def __getattr__(name):\n    if name == 'Omni':\n        return 1\n",
            "omni/newthing.py": "from omni import outputs\nfrom omni.nothing import x\n",
        }
    )
    assert sorted(check(sources)) == [
        "omni/config/schema.py:4 imports transformers: omni.config must stay torch-free",
        "omni/core/a.py:1 imports torch: omni.core may import only the standard library and "
        "numpy, xxhash",
        "omni/engine/engine.py:1 imports stages: forbidden (adapters are looked up through "
        "omni.registry's strings)",
        "omni/messages.py:1 imports kernels: upward (messages -> kernels)",
        "omni/messages.py:2 imports omni: upward (messages -> omni)",
        "omni/newthing.py: module omni.newthing is in no layer (add it to LAYERS)",
        "omni/newthing.py:1 imports omni: it has no module or name 'outputs'",
        "omni/newthing.py:2 imports omni.nothing: no such module in omni/",
    ]


def test_checker_reports_cycles():
    sources = _pkg(
        {
            # engine.a -> engine.b -> engine.c -> engine.a (function-level imports count)
            "omni/engine/a.py": "from omni.engine import b\n",
            "omni/engine/b.py": "def f():\n    from . import c\n",
            "omni/engine/c.py": "import omni.engine.a\n",
            # a package __init__ and its submodule importing the package: also a cycle
            "omni/config/__init__.py": "from omni.config.schema import S\nY = 2\n",
            "omni/config/schema.py": "from omni.config import load\nS = 1\n",
            "omni/config/load.py": "",
            # TYPE_CHECKING imports are not cycles
            "omni/driver/x.py": "import typing\nif typing.TYPE_CHECKING:\n    import omni.driver.y\n",
            "omni/driver/y.py": "import omni.driver.x\n",
        }
    )
    # `from omni.config import load` names the submodule omni.config.load, not the package.
    assert check(sources) == [
        "import cycle: omni.engine.a -> omni.engine.b -> omni.engine.c -> omni.engine.a"
    ]
    sources["omni.config.schema"] = ("omni/config/schema.py", "from omni.config import Y\nS=1\n")
    assert check(sources) == [
        "import cycle: omni.config -> omni.config.schema -> omni.config",
        "import cycle: omni.engine.a -> omni.engine.b -> omni.engine.c -> omni.engine.a",
    ]


def test_find_cycles_reports_each_component_once():
    graph = {"a": {"b"}, "b": {"c", "a"}, "c": {"a"}, "d": {"d"}, "e": {"a"}}
    assert find_cycles(graph) == [["a", "b", "a"], ["d", "d"]]


def test_checker_catches_edges_planted_in_the_real_tree():
    sources = module_sources(REPO / "omni")
    path, text = sources["omni.core.request"]
    sources["omni.core.request"] = (path, text + "\n\ndef _f():\n    import omni.messages\n")
    problems = check(sources)
    assert any(
        p.startswith(f"{path}:") and p.endswith("upward (core -> messages)") for p in problems
    )
    assert any(p.startswith("import cycle:") and "omni.core.request" in p for p in problems)
