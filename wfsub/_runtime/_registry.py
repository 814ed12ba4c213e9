"""The workflows a Substrate knows by name, with their versions: what durable cases start from and replay on.

`workflows={name: term}` or `{name: [older, ..., newest]}`, where each entry is a term or a `Workflow(term,
input=Model)` (the two mix in one list). Every version is validated and compiled when the Substrate is made, so a
broken workflow fails at once, not at the first case. A case records its workflow's name and its program's
fingerprint, and runs on the version with that fingerprint; new cases start on the newest. `call(name)` finds the
newest version of a registered workflow, or an entry of `library=` (the older spelling of the same registry); a
name in both is an error.

A version's `input` model is what its start data must fit: `new_case` checks it (`_inputs.start_data`) before
anything is scheduled or written. Its JSON Schema is kept here (`input_schemas`), by workflow name, for what
shows or checks start data outside the process.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from .._compiler import DEFAULT_MAX_CALL_DEPTH, compile_workflow
from .._errors import InvalidWorkflow, WorkflowNotRegistered
from .._program import Program
from .._terms import Term


@dataclass(frozen=True, slots=True)
class Workflow:
    """A registered workflow with the model its start data must fit:
    `Substrate(workflows={"loan": Workflow(loan, input=LoanApplication)})`.

    `new_case("loan", data)` validates `data` against `input` (a pydantic model class) and refuses data that does
    not fit with `InvalidStartData`, carrying pydantic's errors, before anything is scheduled or written; the case
    starts with the model's JSON-mode dump (defaults filled in). In a list of versions each entry may be a
    `Workflow` or a bare term (a bare term checks nothing); new cases start on the newest.
    """

    term: Term
    input: type[BaseModel] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.term, Term):
            raise TypeError(
                f"Workflow takes a workflow term built with wfsub's constructors (seq, par, task, ...), got "
                f"{type(self.term).__name__} {self.term!r}"
            )
        if self.input is not None and not (isinstance(self.input, type) and issubclass(self.input, BaseModel)):
            raise TypeError(
                f"Workflow(input=...) takes a pydantic model class (class LoanApplication(BaseModel): ...), got "
                f"{self.input!r}"
            )


def entries(given: object) -> list[Term | Workflow] | None:
    """The versions of one `workflows=` entry (a term, a Workflow, or a non-empty list of them), or None when it
    is not one."""
    listed = list(given) if isinstance(given, Sequence) and not isinstance(given, str) else [given]
    if not listed or not all(isinstance(t, Term | Workflow) for t in listed):
        return None
    return listed  # type: ignore[return-value]


def term_of(entry: Term | Workflow) -> Term:
    """The term of a `workflows=` entry."""
    return entry.term if isinstance(entry, Workflow) else entry


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
        models: dict[str, list[type[BaseModel] | None]] = {}
        for name, given in (workflows or {}).items():
            if not isinstance(name, str) or not name:
                raise TypeError(f"workflow names are non-empty str, got {name!r}")
            listed = entries(given)
            if listed is None:
                raise TypeError(
                    f"workflows[{name!r}] must be a workflow term or Workflow(term, input=Model), or a non-empty "
                    f"list of them (oldest first), got {given!r}"
                )
            versions[name] = [term_of(e) for e in listed]
            models[name] = [e.input if isinstance(e, Workflow) else None for e in listed]
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
        self.inputs: dict[str, type[BaseModel]] = {}  # fingerprint -> the model its start data must fit
        self.input_schemas: dict[str, dict[str, Any]] = {}  # name -> its newest version's input JSON Schema
        for name, terms in versions.items():
            programs = [self._compile_version(name, i, len(terms), t) for i, t in enumerate(terms)]
            self.versions[name] = programs
            for program, model in zip(programs, models[name], strict=True):
                self.by_fingerprint.setdefault(program.fingerprint, (name, program))
                if model is not None:
                    self.inputs.setdefault(program.fingerprint, model)
            newest = models[name][-1]
            if newest is not None:
                self.input_schemas[name] = newest.model_json_schema()
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

    def input_of(self, program: Program) -> type[BaseModel] | None:
        """The model a case's start data must fit on this version (None: any JSON mapping)."""
        return self.inputs.get(program.fingerprint)

    def find(self, fingerprint: str) -> tuple[str, Program] | None:
        """The registered version with this fingerprint (name, program), or None."""
        return self.by_fingerprint.get(fingerprint)

    def name_of(self, program: Program) -> str | None:
        found = self.by_fingerprint.get(program.fingerprint)
        return found[0] if found is not None else None
