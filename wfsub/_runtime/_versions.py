"""A program version's summary, for a tool that shows cases (the inspector, `wfsub.contrib.web`): what it draws a
case with, and the signal and update names its forms offer.

A Substrate summarizes a version it registered itself, drawing included, with or without a store; any other
version, and every version for a `wfsub.Client`, comes from the summaries the store keeps (each written, with its
drawing, by the Substrate that registered the version there). None: nobody here knows the version.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._client import Client
from ._substrate import Substrate
from ._summary import summary_of


async def version_summary(
    door: object, fingerprint: str | None, *, workflow: str | None = None
) -> Mapping[str, Any] | None:
    """The program summary of version `fingerprint` as `door` (a Substrate or a Client) knows it (see the module);
    `fingerprint` None: the newest version of `workflow` (the one a Substrate without a store runs every case of
    it on: their status names no version). None when it knows none, or `door` is neither (an object of the
    inspector's own protocol)."""
    if isinstance(door, Substrate):
        registry = door._workflows
        if fingerprint is not None:
            found = registry.find(fingerprint)
        else:
            versions = registry.versions.get(workflow or "")
            found = (workflow, versions[-1]) if workflow and versions else None
        if found is not None:
            name, program = found
            return summary_of(name, program, registry.input_of(program), drawn=True).summary
        store = door._store
    elif isinstance(door, Client):
        store = door._store
    else:
        return None
    if store is None:  # a Substrate without a store knows only what it registered
        return None
    if fingerprint is not None:
        kept = await store.program(fingerprint)
    else:
        kept = await store.newest_program(workflow) if workflow else None
    return None if kept is None else kept.summary
