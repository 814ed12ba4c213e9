"""Updates and checked signals in the vm: `check=` when a wait takes an input, answers to updates, `reply` steps.

An update is a signal with an id its sender waits on. The vm takes it as it takes a signal (a waiting thread
now, else buffered if the name is persistent), and on taking it:

- the `check=` of the wait (or of the defer's branch) runs on the thread's data and the payload; a string
  refuses the input: it is dropped (the waiting thread stays where it was, a buffered one is dropped and the
  next one looked at) and, for an update, the refusal is its answer;
- `wait(reply=fn)`: fn(ctx) after the payload is merged is the answer;
- otherwise the update is owed by the thread that took it: a later `reply(name, fn)` step of that thread answers
  it. "Ahead" is judged where the thread parks (`Program.reply_reach`, the compiler's per-instruction facts): one
  that parks (on an effect, a timer, a signal, a lock, a milestone, a child) with a reply step of that name still
  ahead on its own way keeps owing it; one with none ahead, or that ends, answers None. A thread withdrawn while it
  owes one (a region cancelled or completed, a join that fired, a failure caught around it) answers "withdrawn",
  naming why. A case that ends, fails or is cancelled first answers "ended": the runtime turns it into
  the case's outcome.

An update that no thread takes now is buffered only while some wait or deferred choice on its name can still be
reached from where the case is (`Program.wait_reach` of each thread's instruction, and of what an open mi or a
net's join can still start); else it is refused at once as "passed" (a double-clicked approve: the case has passed
every wait for it), and so is a buffered one once the case has passed them all (checked after each burst while
one is buffered). A plain signal in that position is buffered as before.

Answers are not state that replay needs: they go out in `answers` (taken by the runtime after each burst, as
effect requests are), and a replayed case computes them again. Buffered update ids and owed updates are state
(kept in `UpdateState`, snapshotted) so a restored case still answers them.

Each answer is `(update id or None, kind, name, value)`, kind one of "answer" (value: the JSON value),
"refused" (value: [the refusal text, the node path]; also for a plain signal, id None, so the runtime can log
it), "passed" (value: [the refusal text, where the case is]), "withdrawn" (value: [why, the node path]),
"error" (value: [the failure text of a reply function, the node path]) and "ended".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import _program as bc
from .._errors import check_failed, check_not_str, reply_failed
from .._json import output_problem
from .._program import Op
from ._net import NetFrame
from ._records import (
    WK_NONE,
    WK_SIGNAL,
    CallFrame,
    Fifo,
    Frame,
    HandlerFrame,
    MIFrame,
    Record,
    Token,
    UndoFrame,
    members,
)
from ._withdraw import refuse

if TYPE_CHECKING:
    from ._interp import Interp

PASS = (KeyboardInterrupt, SystemExit, GeneratorExit)


class UpdateState(Record):
    """What a case keeps about updates between bursts: the ids of buffered updates (by arrival seq), the updates
    owed by threads (`[token, name, id]`), and the answers not yet taken."""

    __slots__ = ("ids", "owing", "answers")

    def __init__(self) -> None:
        self.ids: dict[int, str] = {}
        self.owing: list[list[Any]] = []
        self.answers: list[tuple[str | None, str, str, Any]] = []


def state(m: Interp) -> UpdateState:
    st = m.updates
    if st is None:
        st = m.updates = UpdateState()
    return st


def run_check(fn: Callable[..., Any] | None, env: Any, payload: Any) -> str | None:
    """fn(ctx, payload) as a refusal text (None: taken). A check that raises or returns neither refuses."""
    if fn is None:
        return None
    try:
        verdict = fn(env, payload)
    except PASS:
        raise
    except BaseException as exc:  # see PASS: a broken check refuses the input, saying why
        return check_failed(fn, exc)
    if verdict is None or isinstance(verdict, str):
        return verdict
    return check_not_str(fn, verdict)


def check_of(m: Interp, tok: Token, name: str) -> Callable[..., Any] | None:
    """The check= of the wait or defer branch where `tok` waits, for signal `name`."""
    op, spec = m.code[tok.ip]
    if op == Op.NET_NODE:
        op, spec = spec.op, spec.arg
    if op == Op.WAIT:
        return spec.check  # type: ignore[no-any-return]
    checks = spec.checks
    return None if checks is None else checks[spec.signals.index(name)]


def waiting_check(m: Interp, name: str, payload: Any) -> tuple[str, str] | None:
    """(refusal, node path) if the thread that would take `name` now refuses it by its check=; None otherwise.
    Reads only: the door's check, made before anything is recorded."""
    queue = m.waiters.get(name)
    if not queue:
        return None
    for tok, wid in queue.items[queue.head :]:
        if tok.alive and tok.wk == WK_SIGNAL and tok.wid == wid:
            refusal = run_check(check_of(m, tok, name), tok.env, payload)
            return None if refusal is None else (refusal, m.paths[tok.ip])
    return None


def _push_front(queue: Fifo, item: Any) -> None:
    if queue.head:
        queue.head -= 1
        queue.items[queue.head] = item
    else:
        queue.items.insert(0, item)


def take_waiting(m: Interp, tok: Token, wid: int, queue: Fifo, name: str, payload: Any, uid: str | None) -> None:
    """A waiting thread takes signal or update `name` (popped from `queue`): its check, then the wake, then the
    answer or the debt."""
    refusal = run_check(check_of(m, tok, name), tok.env, payload)
    if refusal is not None:
        _push_front(queue, (tok, wid))  # it goes on waiting, first in line as it was
        _refused(m, tok.ip, name, uid, refusal)
        return
    wait_ip = tok.ip
    m._wake(tok, name, payload)
    if uid is not None:
        took(m, tok, wait_ip, name, uid)


def take_buffered(m: Interp, tok: Token, ip: int, name: str, fn: Callable[..., Any] | None) -> Any:
    """The oldest buffered `name` that the check at `ip` takes, as (payload, update id); refused ones are
    dropped on the way. None when none is left."""
    queue = m.buffered.get(name)
    while queue:
        taken = take_head(m, tok, ip, name, fn)
        if taken is not None:
            return taken
    return None


def take_head(m: Interp, tok: Token, ip: int, name: str, fn: Callable[..., Any] | None) -> Any:
    """The oldest buffered `name` as (payload, update id) if the check at `ip` takes it; else it is dropped
    (refused) and the answer is None."""
    seq, payload = m.buffered[name].popleft()
    st = m.updates
    uid = st.ids.pop(seq, None) if st is not None and st.ids else None
    refusal = run_check(fn, tok.env, payload)
    if refusal is None:
        return payload, uid
    _refused(m, ip, name, uid, refusal)
    return None


def buffer_id(m: Interp, name: str, uid: str) -> None:
    """Signal `name` was just buffered as update `uid` (its seq is the latest)."""
    state(m).ids[m.signal_seq] = uid


def _refused(m: Interp, ip: int, name: str, uid: str | None, refusal: str) -> None:
    state(m).answers.append((uid, "refused", name, [refusal, m.paths[ip]]))
    if m.tl:
        m.emit("signal_dropped", m.paths[ip], {"signal": name, "reason": refusal})


def took(m: Interp, tok: Token, wait_ip: int, name: str, uid: str) -> None:
    """Thread `tok` took update `uid` at the wait at `wait_ip`: answer it now (reply=) or owe it."""
    op, spec = m.code[wait_ip]
    if op == Op.NET_NODE:
        op, spec = spec.op, spec.arg
    fn = spec.reply if op == Op.WAIT else None
    if fn is not None:
        answer(m, tok, wait_ip, name, uid, fn)
    else:
        state(m).owing.append([tok, name, uid])


def answer(m: Interp, tok: Token, ip: int, name: str, uid: str, fn: Callable[..., Any]) -> bool:
    """fn(ctx) as the answer of update `uid`; a reply function that raises or gives no JSON value fails the
    step at `ip` (the update's answer is that failure). False if it failed."""
    try:
        value = fn(tok.env)
    except PASS:
        raise
    except BaseException as exc:  # see PASS: the failure is a failure at the step
        text = reply_failed(name, fn, f"raised {type(exc).__name__}: {exc}")
        state(m).answers.append((uid, "error", name, [text, m.paths[ip]]))
        tok.ip = ip
        refuse(m, tok.frame, ip, text)
        return False
    problem = output_problem(value, "its answer")
    if problem is not None:
        text = reply_failed(name, fn, f"returned no JSON value ({problem}); return dicts, lists, str, numbers")
        state(m).answers.append((uid, "error", name, [text, m.paths[ip]]))
        tok.ip = ip
        refuse(m, tok.frame, ip, text)
        return False
    state(m).answers.append((uid, "answer", name, value))
    return True


def _op_reply(m: Interp, tok: Token, ip: int, spec: bc.ReplySpec) -> int:
    """REPLY: answer the update `spec.name` this thread owes (the oldest); a thread that owes none passes by."""
    st = m.updates
    if st is not None:
        for i, entry in enumerate(st.owing):
            if entry[0] is tok and entry[1] == spec.name:
                del st.owing[i]
                if not answer(m, tok, ip, spec.name, entry[2], spec.fn):
                    return -1
                break
    return ip + 1


def settle(m: Interp) -> None:
    """After a burst: an owed update whose thread parked with no reply step of its name ahead (or ended) is
    answered None, one whose thread was withdrawn "withdrawn"; a case that ended answers "ended" (its outcome is
    the runtime's to say). The rest stay owed."""
    st = m.updates
    if st is None or not st.owing:
        return
    keep = []
    for entry in st.owing:
        tok, name, uid = entry[0], entry[1], entry[2]
        if m.ended:
            st.answers.append((uid, "ended", name, None))
        elif not tok.alive:
            if m.cancelling or m.failing is not None:
                keep.append(entry)  # withdrawn by the case's cancel or failure: the case's end answers it
            elif len(entry) > 3:  # withdrawn (`_withdraw.drop` said why) before it replied
                st.answers.append((uid, "withdrawn", name, [entry[3], m.paths[tok.ip]]))
            else:
                st.answers.append((uid, "answer", name, None))
        elif tok.wk == WK_NONE or reply_ahead(m, tok, name):
            keep.append(entry)
        else:
            st.answers.append((uid, "answer", name, None))
    st.owing = keep


def reply_ahead(m: Interp, tok: Token, name: str) -> bool:
    """Whether a reply step for update `name` is ahead of thread `tok` on its own way: `Program.reply_reach` of its
    instruction; where that says the thread can reach the end of its called workflow or handler, on from where its
    call returns or its handler goes on (a handler undoing withdrawn work ends there). A program without those facts:
    whether the workflow has such a step at all."""
    program = m.program
    reach = program.reply_reach
    if not reach:
        return name in program.replies
    bits = program.update_bits
    bit = 1 << bits[name]
    done = 1 << len(bits)  # (`_reach.exit_bit`)
    ip = tok.ip
    frame: Frame | None = tok.frame
    while True:
        found = reach[ip]
        if found & bit:
            return True
        if not found & done:
            return False
        while frame is not None and not isinstance(frame, CallFrame | HandlerFrame | UndoFrame):
            frame = frame.parent
        if isinstance(frame, CallFrame):
            ip = frame.ret
        elif isinstance(frame, HandlerFrame):
            ip = frame.then
        else:
            return False  # the end of a handler undoing withdrawn work: its thread ends there
        frame = frame.parent


def can_take(m: Interp, name: str) -> bool:
    """Whether some wait or deferred choice on update `name` can still be reached from where the case is: from a
    live thread's instruction, or from what an open mi (its body, what follows it) or a net (the joins holding
    tokens, what follows it once a token reached its end) can still start without a thread. O(threads) at most:
    depth first, so the first thread that can reach one (in a big mi, usually the first instance) ends the walk."""
    program = m.program
    reach = program.wait_reach
    bit = program.update_bits.get(name)
    if not reach or bit is None:
        return True  # (no facts: buffered, as before)
    walks: list[Any] = [members(m.root)]
    while walks:
        child = next(walks[-1], None)
        if child is None:
            walks.pop()
        elif type(child) is Token:
            if child.alive and reach[child.ip] >> bit & 1:
                return True
        else:
            if isinstance(child, MIFrame):
                spec = child.spec
                if spec.dynamic and not child.closed and (reach[spec.body] | reach[spec.after]) >> bit & 1:
                    return True
            elif isinstance(child, NetFrame):
                net = child.spec
                starts = [net.entries[j] for j in child.held]
                if child.reached:
                    starts.append(net.after)
                if any(reach[ip] >> bit & 1 for ip in starts):
                    return True
            walks.append(members(child))
    return False


def passed(m: Interp, name: str, uid: str) -> None:
    """Update `uid` can never be taken: the case has passed every wait for it. Refused, naming where it is."""
    at = m.threads_at()
    waits = m.program.update_waits.get(name, ())
    here = " and ".join(at) if at else "nowhere: every thread has ended"
    reason = (
        f"the case has passed every wait for it ({' and '.join(waits)}) and can reach none of them again from where "
        f"it is now ({here}); a repeated update (a double click) gets the first call's answer only with the first "
        "call's request_id: send an update only while a wait for it is ahead"
    )
    state(m).answers.append((uid, "passed", name, [reason, at[0] if at else m.program.root_path]))
    if m.tl:
        m.emit("signal_dropped", "", {"signal": name, "reason": "no wait for it can be reached any more"})


def drop_passed(m: Interp) -> None:
    """After a burst, while updates are buffered: those whose name no wait can take any more are refused (a
    double click that came while the case was still before the wait, which the first click then passed)."""
    st = m.updates
    if st is None or not st.ids or m.ended or not m.program.wait_reach:
        return
    for name, queue in list(m.buffered.items()):
        held = queue.items[queue.head:]
        uids = [st.ids.get(seq) for seq, _ in held]
        if not any(uids) or can_take(m, name):
            continue
        queue.items = [item for item, uid in zip(held, uids, strict=True) if uid is None]
        queue.head = 0
        if not queue.items:
            del m.buffered[name]
        for (seq, _), uid in zip(held, uids, strict=True):
            if uid is not None:
                del st.ids[seq]
                passed(m, name, uid)


def take_answers(m: Interp) -> list[tuple[str | None, str, str, Any]]:
    st = m.updates
    if st is None or not st.answers:
        return []
    out, st.answers = st.answers, []
    return out


def owes(m: Interp, uid: str) -> bool:
    st = m.updates
    if st is None:
        return False
    return uid in st.ids.values() or any(entry[2] == uid for entry in st.owing)


def owed(m: Interp) -> list[str]:
    """The ids of the updates buffered or owed by a thread (the case will answer them), in no set order."""
    st = m.updates
    if st is None:
        return []
    return [uid for uid in (*st.ids.values(), *(entry[2] for entry in st.owing)) if uid is not None]
