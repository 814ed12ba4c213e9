"""Each public module exports exactly what its __all__ lists."""

from __future__ import annotations

import importlib
import subprocess
import sys
import types

import pytest


@pytest.mark.parametrize(
    "name",
    [
        "wfsub",
        "wfsub.contrib.diagram",
        "wfsub.contrib.otel",
        "wfsub.lowlevel",
        "wfsub.runtime",
        "wfsub.stores",
        "wfsub.terms",
        "wfsub.testing",
    ],
)
def test_public_names_match_all(name: str) -> None:
    """Every public attribute is in __all__, every __all__ entry exists, and __all__ is sorted."""
    module = importlib.import_module(name)
    public = {  # dir(): a name imported on first use (a module __getattr__) is listed by the module's __dir__
        attr
        for attr in dir(module)
        if not attr.startswith("_")
        and not isinstance(getattr(module, attr), types.ModuleType)
        and attr != "annotations"
    }
    assert sorted(module.__all__) == module.__all__
    assert set(module.__all__) == public


@pytest.mark.parametrize(
    ("module", "name", "instead"),
    [("wfsub", "Program", "wfsub.lowlevel"), ("wfsub.lowlevel", "compile_workflow", "wfsub.compile")],
)
def test_old_names_warn_and_point_at_the_one_public_name(module: str, name: str, instead: str) -> None:
    """A deprecated alias still works, with a DeprecationWarning naming the one public name to use instead."""
    with pytest.warns(DeprecationWarning, match=instead):
        value = getattr(importlib.import_module(module), name)
    assert value is not None


def test_public_submodules_are_reached_from_a_bare_import_and_loaded_only_when_used() -> None:
    """After `import wfsub` alone, `wfsub.stores.SqliteStore` and the like work, and nothing loads before its use."""
    code = (
        "import sys, wfsub\n"
        "assert 'wfsub.stores' not in sys.modules and 'wfsub.cli' not in sys.modules\n"
        "assert wfsub.stores.SqliteStore and wfsub.testing.VirtualClock and wfsub.lowlevel.Machine\n"
        "assert wfsub.terms.seq and wfsub.runtime.Substrate and wfsub.contrib\n"
        "assert 'click' not in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_lazy_names_are_the_names_type_checkers_see() -> None:
    """wfsub's first-use table and its TYPE_CHECKING imports name the same objects, so mypy sees what runs."""
    import ast
    from pathlib import Path

    import wfsub

    tree = ast.parse(Path(wfsub.__file__).read_text())
    (block,) = [
        node for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
    ]
    seen = {
        alias.asname or alias.name: ("." * node.level + (node.module or ""), alias.name)
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert seen == wfsub._LAZY
