"""Schedulers: which ready token runs next, and which interleaved branch goes first.

`Deterministic` runs tokens first-in first-out and lets a token run until it parks, ends or the budget runs
out; it is the default and the fastest. `Seeded` and `Replay` are preemptive: a choice is made before every
step, so they explore the interleavings of parallel branches. `Seeded` draws from a small counter-based
generator (splitmix64) whose whole state is one int, so a snapshot can carry it and the choices are the same
on every Python version; every choice among two or more options is appended to `log`. `Replay(log)` makes
exactly those choices again.
"""

from __future__ import annotations

from typing import Any

from .._errors import MachineStateError

_MASK = (1 << 64) - 1


class Scheduler:
    """Base: `pick(n)` returns an index in range(n) (n >= 1)."""

    preemptive = False
    log: list[int]

    def pick(self, n: int) -> int:
        return 0

    def to_state(self) -> dict[str, Any]:
        return {"kind": "deterministic"}


class Deterministic(Scheduler):
    """First in, first out; a token runs until it parks, ends, or the quanta run out."""

    def __init__(self) -> None:
        self.log = []

    def __repr__(self) -> str:
        return "Deterministic()"


DETERMINISTIC = Deterministic()
"""The one default scheduler every machine shares: it keeps no state (its log stays empty), and a case saves
two objects the garbage collector would otherwise walk."""


class Seeded(Scheduler):
    """Random choices from `seed`, logged in `log` for `Replay`."""

    preemptive = True

    def __init__(self, seed: int) -> None:
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise TypeError(f"Seeded(seed) takes an int seed, got {seed!r}")
        self.seed = seed
        self.state = seed & _MASK
        self.log = []

    def _next(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & _MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        return z ^ (z >> 31)

    def pick(self, n: int) -> int:
        if n <= 1:
            return 0
        choice = self._next() % n
        self.log.append(choice)
        return choice

    def to_state(self) -> dict[str, Any]:
        return {"kind": "seeded", "seed": self.seed, "state": self.state, "log": list(self.log)}

    def __repr__(self) -> str:
        return f"Seeded({self.seed})"


class Replay(Scheduler):
    """Make the choices of a logged run again, in order."""

    preemptive = True

    def __init__(self, log: list[int]) -> None:
        self.choices = list(log)
        self.position = 0
        self.log = []

    def pick(self, n: int) -> int:
        if n <= 1:
            return 0
        if self.position >= len(self.choices):
            raise MachineStateError(
                f"replay log exhausted after {len(self.choices)} choices: the log is from a different run"
            )
        choice = self.choices[self.position]
        if not 0 <= choice < n:
            raise MachineStateError(
                f"replay diverged at choice {self.position}: log says {choice}, but only {n} options exist"
            )
        self.position += 1
        self.log.append(choice)
        return choice

    def to_state(self) -> dict[str, Any]:
        return {"kind": "replay", "choices": list(self.choices), "position": self.position, "log": list(self.log)}

    def __repr__(self) -> str:
        return f"Replay(<{len(self.choices)} choices>)"


def scheduler_from_state(state: dict[str, Any]) -> Scheduler:
    kind = state.get("kind")
    sched: Scheduler
    if kind == "deterministic":
        return DETERMINISTIC
    if kind == "seeded":
        seeded = Seeded(int(state["seed"]))
        seeded.state = int(state["state"])
        sched = seeded
    elif kind == "replay":
        replay = Replay(list(state["choices"]))
        replay.position = int(state["position"])
        sched = replay
    else:
        raise MachineStateError(f"unknown scheduler kind {kind!r} in snapshot")
    sched.log = [int(c) for c in state["log"]]
    return sched
