"""What the `wfsub` command works on: a store opened without owning it, and workflows named `module:attribute`.

A store is opened with `owner=False`: the command reads rows and journals and writes inputs to the inbox,
never the journal of a case, so it runs beside the Substrate that owns the store. It opens only a file that
is already a wfsub store (a mistyped path is an error, not a new empty store).

`module:attribute` names a workflow the way `uvicorn` names an app: the module is imported with the current
directory first on `sys.path`, and the attribute (dots walk into it) is a workflow term, or a mapping of name
-> term or `Workflow(term, input=Model)` (or -> [older, ..., newest] versions of them), as a Substrate takes in
`workflows=`.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import click

from .. import InvalidWorkflow, StoreError, Term

# The stores, the compiler and the runtime are imported where they are used: `wfsub --help` loads none of them.
if TYPE_CHECKING:
    from ..lowlevel import Program
    from ..stores import CaseRow, Store


class CliError(click.ClickException):
    """An error the command reports on stderr (as `Error: ...`) with exit status 1."""


# -- stores ---------------------------------------------------------------------------------------------------


def _store_for_cli(spec: str) -> Store:
    from ..stores import open_store

    try:
        return open_store(spec, existing=True)  # a store a Substrate created: never a new one, nor a memory one
    except (StoreError, TypeError) as exc:
        raise CliError(str(exc)) from exc


@asynccontextmanager
async def opened(spec: str) -> AsyncIterator[Store]:
    """The store `spec` names, open for reading and for inputs (not owned), closed on the way out."""
    store = _store_for_cli(spec)
    await open_noting(store)
    try:
        yield store
    finally:
        await store.close()


SLOW_OPEN = 1.0  # seconds an open may take before the command says what it waits for


async def open_noting(store: Store) -> None:
    """Open the store for the command (not owning it), saying what it waits for when that is slow (see below);
    CliError with the store's reason when it cannot be opened."""
    done = anyio.Event()
    failure: StoreError | None = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(note_a_slow_open, store, done)
        try:
            await store.open(owner=False, owner_id=f"wfsub-command-{os.getpid()}")
        except StoreError as exc:  # (raised here, not from the task group, which would wrap it in a group)
            failure = exc
        finally:
            done.set()
    if failure is not None:
        raise CliError(str(failure)) from failure


async def note_a_slow_open(store: Store, opened: anyio.Event) -> None:
    """Say on stderr what the command waits for when opening the store takes more than SLOW_OPEN seconds (until
    `opened` is set): a database that is down is waited for (`retry_for`) before the command fails, and silence
    looks like a hang."""
    with anyio.move_on_after(SLOW_OPEN):
        await opened.wait()
    if not opened.is_set():
        waits = getattr(store, "retry_for", None)
        bound = f" for up to {waits:g} s (retry_for=)" if isinstance(waits, int | float) else ""
        click.echo(f"wfsub: waiting for {store.url} to answer{bound}; Ctrl+C stops", err=True)


async def case_row(store: Store, case_id: str) -> CaseRow:
    """The case's row, or an error that says how to find the right id."""
    row = await store.row(case_id)
    if row is None:  # (an id of any length may be asked for: one longer than any case's is not echoed whole)
        shown = repr(case_id) if len(case_id) <= 1000 else f"{case_id[:60]!r}... ({len(case_id):,} characters)"
        raise CliError(
            f"no case {shown} in {store.url}: `wfsub cases {store.url}` lists its cases (newest first)"
        )
    return row


# -- workflows ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """A loaded `module:attribute`: one term, or a registry of named workflows with their versions."""

    spec: str
    term: Term | None
    registry: Mapping[str, Any] | None

    def pick(self, name: str | None) -> tuple[str | None, Term]:
        """The term to draw, check or list: the target itself, or the registry entry `name` (newest version)."""
        if self.term is not None:
            return name, self.term
        assert self.registry is not None
        names = sorted(self.registry)
        if name is None:
            if len(names) != 1:
                raise CliError(
                    f"{self.spec} holds {len(names)} workflows ({', '.join(names) or 'none'}): choose one with "
                    "--name NAME"
                )
            name = names[0]
        if name not in self.registry:
            raise CliError(f"{self.spec} has no workflow {name!r}: it has {', '.join(names) or 'none'}")
        versions = self.registry[name]
        newest = versions[-1] if isinstance(versions, list | tuple) else versions
        if isinstance(newest, Term):
            return name, newest
        from ..lowlevel import term_of

        return name, term_of(newest)

    def program_for(self, row: CaseRow) -> tuple[Program, str | None]:
        """The program a case ran on (and a warning when only another version of it is at hand)."""
        if self.term is not None:
            program = _compile(self.spec, self.term)
            if program.fingerprint == row.fingerprint:
                return program, None
            return program, (
                f"case {row.case_id!r} ran on version {row.fingerprint[:12]} of {row.workflow!r}; {self.spec} "
                f"compiles to {program.fingerprint[:12]}: a divergence may come from the change of version"
            )
        from ..lowlevel import Workflows

        assert self.registry is not None
        try:
            workflows = Workflows(self.registry, None)
        except InvalidWorkflow as exc:
            raise CliError(f"{self.spec}: {exc}") from exc
        found = workflows.find(row.fingerprint)
        if found is not None:
            return found[1], None
        if row.workflow not in workflows.versions:
            raise CliError(
                f"{self.spec} has no workflow {row.workflow!r}, which case {row.case_id!r} ran on: it has "
                f"{', '.join(workflows.names) or 'none'}"
            )
        program = workflows.newest(row.workflow)
        return program, (
            f"case {row.case_id!r} ran on version {row.fingerprint[:12]} of {row.workflow!r}, which {self.spec} does "
            f"not hold; replaying on its newest version {program.fingerprint[:12]}"
        )


def _compile(spec: str, term: Term) -> Program:
    from .. import compile as compile_workflow

    try:
        return compile_workflow(term)
    except InvalidWorkflow as exc:
        raise CliError(f"{spec}: {exc}") from exc


def load_attr(spec: str) -> tuple[Any, Any]:
    """Import `module:attribute` (the current directory importable): (the attribute, its module)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise CliError(
            f"{spec!r} is not MODULE:ATTRIBUTE: name the module and the object in it, e.g. app.flows:order_flow"
        )
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            raise CliError(
                f"cannot import module {module_name!r} ({exc}): run wfsub from the directory that holds it, or "
                "install its package in this environment"
            ) from exc
        raise CliError(f"importing {module_name!r} failed: {exc}") from exc
    except Exception as exc:
        raise CliError(f"importing {module_name!r} raised {type(exc).__name__}: {exc}") from exc
    value: Any = module
    walked = module_name
    for part in attr.split("."):
        if not hasattr(value, part):
            raise CliError(f"{walked} has no attribute {part!r}{_workflows_in(value)}")
        value = getattr(value, part)
        walked = f"{walked}:{part}" if walked == module_name else f"{walked}.{part}"
    return value, module


def load_target(spec: str) -> Target:
    """Import `module:attribute` and check it names workflows."""
    value, module = load_attr(spec)
    if isinstance(value, Term):
        return Target(spec, value, None)
    if isinstance(value, Mapping) and value and all(_is_versions(v) for v in value.values()):
        return Target(spec, None, value)
    raise CliError(
        f"{spec} is a {type(value).__name__}, not a workflow: point at a term built with wfsub's constructors "
        "(seq, par, task, ...) or at a dict of name -> term (or Workflow) as given to Substrate(workflows=...)"
        f"{_workflows_in(module)}"
    )


def load_redact(spec: str | None) -> Callable[[Any], Any]:
    """The app's `redact=` function named `module:attribute` (None: nothing is hidden)."""
    if spec is None:
        return lambda value: value
    value, _ = load_attr(spec)
    if not callable(value):
        raise CliError(f"--redact {spec} is a {type(value).__name__}, not a function over data (the app's redact=)")
    redact: Callable[[Any], Any] = value
    return redact


def _is_versions(value: object) -> bool:
    """A `workflows=` entry: a term or a Workflow, or a non-empty list of them."""
    terms = value if isinstance(value, list | tuple) else [value]
    if terms and all(isinstance(v, Term) for v in terms):
        return True  # terms alone: no need to load the runtime, where Workflow lives
    from ..lowlevel import workflow_entries

    return workflow_entries(value) is not None


def _workflows_in(namespace: object) -> str:
    names = sorted(
        name for name, v in vars(namespace).items()
        if not name.startswith("_") and (_is_versions(v) or (isinstance(v, Mapping) and v and
                                                              all(_is_versions(x) for x in v.values())))
    ) if hasattr(namespace, "__dict__") else []
    return f" (workflows there: {', '.join(names)})" if names else ""
