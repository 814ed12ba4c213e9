"""Updates in the reference interpreter, written from the contract (not from the vm): an update is a signal with
an id; the wait that takes it answers with `reply=` (on the data with the payload merged), else the thread that took
it owes the answer until a `reply` step of its own; the thread answers None when it parks on anything but its own
effect, or ends (a case that ends answers "ended"). A `check=` refusal of a buffered input is its answer. A reply
function that raises or gives no JSON value fails the step, and that failure is the answer."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from wfsub._json import output_problem
from wfsub._terms import Wait

if TYPE_CHECKING:
    from ._blocks import Thread
    from ._engine import Engine


def took(e: Engine, th: Thread, t: Any, path: str, name: str, uid: str) -> None:
    if isinstance(t, Wait) and t.reply is not None:
        answer(e, th, path, name, uid, t.reply)
    else:
        e.owing.append([th, name, uid])


def answer(e: Engine, th: Thread, path: str, name: str, uid: str, fn: Any) -> bool:
    try:
        value = fn(th.env)
    except Exception as exc:
        e.answers.append((uid, "error", name, None))
        e.fail(th.block, "StepFailed", path, str(exc))
        return False
    if output_problem(value, "its answer") is not None:
        e.answers.append((uid, "error", name, None))
        e.fail(th.block, "StepFailed", path, "no JSON value")
        return False
    e.answers.append((uid, "answer", name, value))
    return True


def do_reply(e: Engine, th: Thread, t: Any, path: str) -> None:
    for i, (owner, name, uid) in enumerate(e.owing):
        if owner is th and name == t.name:
            del e.owing[i]
            answer(e, th, path, name, uid, t.fn)
            return


def settle(e: Engine) -> None:
    keep = []
    for entry in e.owing:
        th, name, uid = entry
        if e.status != "running":
            e.answers.append((uid, "ended", name, None))
        elif not th.alive:
            if e.cancelling or e.failing is not None:
                keep.append(entry)
            else:
                e.answers.append((uid, "answer", name, None))
        elif th.park == "" or (th.park == "effect" and name in e.replies):
            keep.append(entry)
        else:
            e.answers.append((uid, "answer", name, None))
    e.owing = keep
