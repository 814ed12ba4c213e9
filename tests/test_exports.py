"""Each public module exports exactly what its __all__ lists."""

from __future__ import annotations

import importlib
import types

import pytest


@pytest.mark.parametrize("name", ["wfsub", "wfsub.lowlevel", "wfsub.runtime", "wfsub.terms", "wfsub.testing"])
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
