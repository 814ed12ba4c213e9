"""Diagrams draw updates: a wait with reply= is drawn as an update wait naming its reply and check, and a reply step
is drawn as its own shape, in Mermaid and DOT, with the step's node path."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from wfsub import reply, seq, task, to_dot, to_mermaid, wait


def answer(ctx: Mapping[str, Any]) -> Any:
    return ctx["n"]


def small(ctx: Mapping[str, Any], payload: Any) -> str | None:
    return None


def bump(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"n": 1}


FLOW = seq(wait("add", reply=answer, check=small), wait("more"), task(bump), reply("more", answer))


def test_mermaid_draws_update_waits_and_reply_steps() -> None:
    """Mermaid: the update wait names reply and check; the reply step is a shape at its path."""
    text = to_mermaid(FLOW)
    assert "update: add<br>reply answer<br>check small" in text
    assert "signal: more" in text
    assert "%% n4: seq[3].reply" in text and 'reply to update more<br>answer' in text


def test_dot_draws_update_waits_and_reply_steps() -> None:
    """DOT: the same labels, the reply step's tooltip is its node path."""
    text = to_dot(FLOW)
    assert 'label="update: add\\nreply answer\\ncheck small"' in text
    assert 'label="reply to update more\\nanswer"' in text and 'tooltip="seq[3].reply"' in text
