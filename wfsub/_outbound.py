"""Steps that act on other cases: `start_case` (a child case) and `signal_case`.

To the vm they are effects: the compiler emits an ordinary EFFECT whose function is an `Outbound` naming the
term, so the vm, the journal, replay, recovery and version checks treat them exactly as effects (their outcome is
recorded like an effect's at their node path; an outcome not yet recorded is attempted again after a recovery).
What the step does is the runtime's (`wfsub._runtime._children`): an `Outbound` is not meant to be awaited by
anything else, and says so when it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._terms import SignalCase, StartCase


class Outbound:
    """The function of the effect a `start_case` or `signal_case` compiles to."""

    __slots__ = ("__qualname__", "term")

    def __init__(self, term: StartCase | SignalCase) -> None:
        self.term = term
        self.__qualname__ = term.kind

    @property
    def label(self) -> str:
        t = self.term
        return f"{t.kind}({(t.workflow if isinstance(t, StartCase) else t.name)!r})"

    async def __call__(self, ctx: Mapping[str, Any]) -> Mapping[str, Any] | None:
        raise RuntimeError(
            f"{self.label} acts on other cases, which only a Substrate can do: run the workflow with "
            "wfsub.Substrate (a driver of a bare Machine must start the child or send the signal itself)"
        )

    def __repr__(self) -> str:
        return f"Outbound({self.term!r})"
