"""Opening a store from what `Substrate(store=...)` was given (interim: store objects only)."""

from __future__ import annotations

from ._base import Store, require_store


def open_store(spec: object) -> Store | None:
    if spec is None:
        return None
    return require_store(spec)
