"""The workflows a Substrate knows by name, with their versions: what durable cases start from and replay on.

`workflows={name: term}` or `{name: [older, ..., newest]}`. Every version is validated and compiled when the
Substrate is made, so a broken workflow fails at once, not at the first case. A case records its workflow's
name and its program's fingerprint, and runs on the version with that fingerprint; new cases start on the
newest. `call(name)` finds the newest version of a registered workflow, or an entry of `library=` (the older
spelling of the same registry); a name in both is an error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .._compiler import DEFAULT_MAX_CALL_DEPTH, compile_workflow
from .._errors import InvalidWorkflow, WorkflowNotRegistered
from .._program import Program
from .._terms import Term


class Workflows:
    """Registered workflows: name -> versions (oldest first), and fingerprint -> (name, program)."""

    def __init__(
        self,
        workflows: Mapping[str, Any] | None,
        library: Mapping[str, Term] | None,
        max_call_depth: int = DEFAULT_MAX_CALL_DEPTH,
    ) -> None:
        if workflows is not None and not isinstance(workflows, Mapping):
            raise TypeError(
                f"workflows must be a mapping of name -> workflow (or -> [older, ..., newest]), got "
                f"{type(workflows).__name__}"
            )
        if library is not None and not isinstance(library, Mapping):
            raise TypeError(f"library must be a mapping of name -> workflow, got {type(library).__name__}")
        versions: dict[str, list[Term]] = {}
        for name, given in (workflows or {}).items():
            if not isinstance(name, str) or not name:
                raise TypeError(f"workflow names are non-empty str, got {name!r}")
            terms = list(given) if isinstance(given, Sequence) and not isinstance(given, str) else [given]
            if not terms or not all(isinstance(t, Term) for t in terms):
                raise TypeError(
                    f"workflows[{name!r}] must be a workflow term or a non-empty list of them (oldest first), "
                    f"got {given!r}"
                )
            versions[name] = terms
        both = sorted(set(versions) & set(library or {}))
        if both:
            raise ValueError(
                f"{', '.join(repr(n) for n in both)} given both in workflows= and in library=: they are one "
                "registry that call() looks names up in; keep each name in one of them"
            )
        self.library: dict[str, Term] = {**dict(library or {}), **{n: ts[-1] for n, ts in versions.items()}}
        self.max_call_depth = max_call_depth
        self.versions: dict[str, list[Program]] = {}
        self.by_fingerprint: dict[str, tuple[str, Program]] = {}
        for name, terms in versions.items():
            programs = [self._compile_version(name, i, len(terms), t) for i, t in enumerate(terms)]
            self.versions[name] = programs
            for program in programs:
                self.by_fingerprint.setdefault(program.fingerprint, (name, program))
        self._cache: dict[Term, Program] = {}

    @property
    def names(self) -> list[str]:
        return sorted(self.versions)

    def _compile_version(self, name: str, index: int, count: int, term: Term) -> Program:
        try:
            return self.compile(term)
        except InvalidWorkflow as exc:  # the issue paths are relative to the term: say which entry it is
            version = f" (version {index + 1} of {count}, oldest first)" if count > 1 else ""
            raise InvalidWorkflow(exc.issues, what=f"workflows[{name!r}]{version}") from None

    def compile(self, term: Term) -> Program:
        return compile_workflow(term, library=self.library or None, max_call_depth=self.max_call_depth)

    def newest(self, name: str) -> Program:
        programs = self.versions.get(name)
        if programs is None:
            raise WorkflowNotRegistered(name, self.versions)
        return programs[-1]

    def find(self, fingerprint: str) -> tuple[str, Program] | None:
        """The registered version with this fingerprint (name, program), or None."""
        return self.by_fingerprint.get(fingerprint)

    def name_of(self, program: Program) -> str | None:
        found = self.by_fingerprint.get(program.fingerprint)
        return found[0] if found is not None else None
