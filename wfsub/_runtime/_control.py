"""The runtime's own control flow: exceptions raised in one module and caught in another, never shown to a user.

Each says where a call must go instead (another node, the stored case, the inbox) or that a case left this
node's hands. None is a `WfsubError`: one that escaped would be a bug in the runtime, not a refusal. They live
here, below every module that raises or catches them, so the raiser and the catcher import neither each other
nor the module that happens to hold the class.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._store import CaseRow

if TYPE_CHECKING:
    from ._case import CaseActor


class Remote(Exception):
    """Internal: the case is another node's (shared stores): inputs for it go through the inbox.

    Raised by `CaseLoader.live` and by the Substrate (`_live` on a standby, `_retry` of a case its owner's lease
    left); caught by the Substrate's input routes, which send through the inbox, by the inbox router and by
    `_children`, which leave the case to its owner.
    """

    def __init__(self, row: CaseRow) -> None:
        self.row = row


class Existing(Exception):  # noqa: N818 (not an error: the answer of a repeated call)
    """Internal: `new_case` met a stored case with its id, workflow and start data: an earlier call of the same
    (its answer lost, say): the call answers with that case (`actor`: in memory here, or None).

    Raised by `CaseLoader.started_before`; caught by `Substrate.new_case`, which answers with that case.
    """

    def __init__(self, actor: CaseActor | None) -> None:
        self.actor = actor


class CaseEvicted(Exception):
    """Internal: an input reached an actor that has just left memory; the sender reloads the case and resends.

    Raised by `CaseActor.send`; caught by the Substrate's `_ask`, which brings the case back and sends again.
    """


class Fenced(Exception):
    """Internal: the store refused the case's own append for good (StoreConflict): another owner has the case.

    Raised by `_case_journal` (a commit or a write of its own refused) and by `CaseActor.run` when a write made
    while it was parked was; caught by `CaseActor.run`, which leaves memory without writing anything more.
    """


class StartRefused(Exception):
    """Internal: the case's queued start data does not fit its input model; the case was failed.

    Raised by `_queued.checked_start`; caught by `CaseLoader.load`, which counts the case as ended here.
    """


class Owned(Exception):
    """Internal: a standby took ownership of its store.

    Raised by the standby's look at the store (`_ownership`) once it owns it; caught there, ending that look.
    """


__all__ = ["CaseEvicted", "Existing", "Fenced", "Owned", "Remote", "StartRefused"]
