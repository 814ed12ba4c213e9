"""Each public module exports exactly what its __all__ lists."""

from __future__ import annotations

import importlib
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
    public = {
        attr
        for attr, value in vars(module).items()
        if not attr.startswith("_") and not isinstance(value, types.ModuleType) and attr != "annotations"
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
