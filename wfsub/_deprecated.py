"""Old public names that still work, with a DeprecationWarning that says what to use instead."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any


def module_getattr(module: str, aliases: Mapping[str, tuple[str, str, str]]) -> Callable[[str], Any]:
    """A module `__getattr__` serving `{old name: (home module, attribute, what to use instead)}`."""

    def __getattr__(name: str) -> Any:
        alias = aliases.get(name)
        if alias is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        home, attribute, instead = alias
        warnings.warn(f"{module}.{name} is deprecated: {instead}", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(home), attribute)

    return __getattr__
