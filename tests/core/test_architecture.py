"""The shape of the package: layering, one direction of imports, and per-construct tables that are complete."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import wfsub
from wfsub import (
    call,
    critical,
    defer,
    effect,
    interleave,
    loop,
    mi,
    milestone,
    multi_choice,
    net,
    par,
    reply,
    saga,
    scope,
    seq,
    sleep,
    task,
    wait,
    when_milestone,
    xor,
)
from wfsub._compiler import _EMIT
from wfsub._program import OPERANDS, Op
from wfsub._terms import term_classes
from wfsub._validate import _CHECKS
from wfsub._vm._ops import HANDLERS, _table
from wfsub._vm._records import record_classes
from wfsub.lowlevel import Machine

PACKAGE = Path(wfsub.__file__).parent

# Layers from the bottom up; a module may import only from layers listed before its own (and itself).
LAYERS = [
    "_errors", "_json", "_terms", "_netgraph", "_validate", "_diagram", "_program", "_reach", "_outbound", "_compiler",
    "_vm",
    "_loops", "_trace", "_store", "_runtime",
]
# The public modules sit on top of everything: the API tiers, the command and the optional extras.
FRONTS = {"__init__", "__main__", "lowlevel", "testing", "terms", "runtime", "stores", "cli", "contrib", "_deprecated"}


def test_every_module_has_a_place_in_the_layers() -> None:
    """A new module is either in a layer or a public front, so the layering test below covers it."""
    placed = set(LAYERS) | FRONTS
    assert sorted({p.relative_to(PACKAGE).parts[0].removesuffix(".py") for p in PACKAGE.rglob("*.py")} - placed) == []


def test_importing_wfsub_loads_neither_the_command_nor_the_extras() -> None:
    """`import wfsub` loads neither click, rich, structlog nor OpenTelemetry: an app pays only for what it uses."""
    # The full list of what `import wfsub` leaves unloaded is in test_import_cost.py.
    watched = ("click", "rich", "structlog", "opentelemetry")
    code = f"import sys, wfsub; print(sorted(m for m in {watched!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_core_imports_no_async_or_logging_library() -> None:
    """Importing the compiler and the vm alone (wfsub/__init__ not run) loads neither anyio, structlog nor trio."""
    code = (
        "import importlib, sys, types\n"
        f"pkg = types.ModuleType('wfsub'); pkg.__path__ = [{str(PACKAGE)!r}]\n"
        "sys.modules['wfsub'] = pkg\n"
        "importlib.import_module('wfsub._compiler'); importlib.import_module('wfsub._vm')\n"
        "print(sorted(m for m in ('anyio', 'structlog', 'trio') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def _layer_of(module: str) -> str:
    return module.split(".")[0]


def _targets(node: ast.AST, here: list[str]) -> list[str]:
    """The wfsub-internal modules one import statement names, as paths relative to the package."""
    if isinstance(node, ast.ImportFrom) and node.level:
        base = here[: len(here) - (node.level - 1)] if node.level > 1 else here
        if node.module:
            return [".".join([*base, *node.module.split(".")])]
        return [".".join([*base, alias.name]) for alias in node.names]  # `from .. import _program as bc`
    if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("wfsub."):
        return [node.module.removeprefix("wfsub.")]
    return []


def _imports(path: Path) -> list[str]:
    """The wfsub-internal modules a file imports, as paths relative to the package (`_vm._records`)."""
    here = list(path.relative_to(PACKAGE).with_suffix("").parts[:-1])
    return [target for node in ast.walk(ast.parse(path.read_text())) for target in _targets(node, here)]


def test_each_layer_imports_only_the_layers_below_it() -> None:
    """No private module imports a layer above its own: the dependency arrows all point one way."""
    wrong = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        layer = rel.parts[0].removesuffix(".py")
        if layer in FRONTS or layer not in LAYERS:
            continue
        for target in _imports(path):
            other = _layer_of(target)
            if other and other != layer and other in LAYERS and LAYERS.index(other) > LAYERS.index(layer):
                wrong.append(f"{rel} imports {target}")
    assert wrong == []


# Inside the vm the same rule holds module by module, bottom up: a module imports, when it is loaded, only modules
# listed before its own. The frames and the handlers reach the interpreter state through the `vm` argument they
# are given; an import under `if TYPE_CHECKING:` only names its type (it never runs).
VM_LAYERS = [
    "_events", "_requests", "_result", "_schedulers", "_records", "_withdraw", "_net", "_updates", "_ops", "_interp",
    "_snapshot",
    "_machine", "__init__",
]


def _load_time_imports(path: Path) -> tuple[list[str], list[int]]:
    """What a module imports when it is loaded (not under `if TYPE_CHECKING:`), and the lines of any import
    made later, inside a function or a class (a call-time import, the usual way to dodge an import circle)."""
    here = list(path.relative_to(PACKAGE).with_suffix("").parts[:-1])
    loaded: list[str] = []
    late: list[int] = []
    todo: list[ast.stmt] = list(ast.parse(path.read_text()).body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            todo.extend(node.orelse)
        elif isinstance(node, ast.If | ast.Try):
            todo.extend(child for child in ast.iter_child_nodes(node) if isinstance(child, ast.stmt))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            loaded.extend(_targets(node, here))
        else:
            late.extend(n.lineno for n in ast.walk(node) if isinstance(n, ast.Import | ast.ImportFrom))
    return loaded, sorted(late)


def test_the_vm_modules_import_one_way_with_no_circle() -> None:
    """Each vm module has a place in VM_LAYERS, loads only modules below it, and imports nothing at call time."""
    modules = {path.stem: path for path in (PACKAGE / "_vm").glob("*.py")}
    assert sorted(set(modules) - set(VM_LAYERS)) == []
    wrong = []
    for name, path in modules.items():
        loaded, late = _load_time_imports(path)
        wrong.extend(f"_vm/{name}.py imports at call time (line {line})" for line in late)
        for target in loaded:
            parts = target.split(".")
            if parts[0] == "_vm" and len(parts) == 2 and VM_LAYERS.index(parts[1]) >= VM_LAYERS.index(name):
                wrong.append(f"_vm/{name}.py imports _vm/{parts[1]}.py, which is not below it in VM_LAYERS")
    assert wrong == []


# The runtime holds the same rule, module by module, bottom up, for what runs: a module imports, when it is loaded
# or inside a function, only modules listed before its own. The case actor's helpers take a `CaseActor`, and
# `_control`'s `Existing` carries one: they name it under `if TYPE_CHECKING:` only, which never runs. Each row is a
# floor: its modules import only rows above it.
RUNTIME_LAYERS = [
    "_control", "_start_request", "_clock", "_status", "_journal", "_request_ids", "_mailbox", "_registry",
    "_summary", "_hub", "_answers", "_durable", "_heartbeat", "_inputs", "_nodes",
    "_compact", "_effects", "_queued", "_queues", "_refusals", "_schedules", "_same_start", "_options",
    "_case_journal", "_children", "_replay",
    "_case_io", "_persist",
    "_case", "_lifecycle",
    "_loader", "_outside",
    "_routing", "_table", "_reads", "_deliver", "_handle", "_starts", "_ownership",
    "_substrate",
    "_client",
    "_versions", "__init__",
]


def _runtime_imports(path: Path) -> list[tuple[str, int]]:
    """The wfsub/_runtime modules a runtime file imports and the line of each, whether the import runs when the
    module is loaded or inside a function; imports under `if TYPE_CHECKING:` (which never run) are left out."""
    here = list(path.relative_to(PACKAGE).with_suffix("").parts[:-1])
    found: list[tuple[str, int]] = []
    todo: list[ast.AST] = list(ast.parse(path.read_text()).body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            todo.extend(node.orelse)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            found.extend((t.split(".")[1], node.lineno) for t in _targets(node, here) if t.startswith("_runtime."))
        else:
            todo.extend(ast.iter_child_nodes(node))
    return found


def _runtime_modules() -> dict[str, Path]:
    return {path.stem: path for path in (PACKAGE / "_runtime").glob("*.py")}


def test_the_runtime_modules_import_one_way() -> None:
    """Each runtime module has a place in RUNTIME_LAYERS and imports, when loaded or at call time, only modules
    below it (a type named under `if TYPE_CHECKING:` aside)."""
    modules = _runtime_modules()
    missing = sorted(set(modules) - set(RUNTIME_LAYERS))
    assert missing == [], f"give each a place in RUNTIME_LAYERS, above every runtime module it imports: {missing}"
    wrong = []
    for name, path in modules.items():
        for target, line in _runtime_imports(path):
            if RUNTIME_LAYERS.index(target) >= RUNTIME_LAYERS.index(name):
                wrong.append(f"_runtime/{name}.py:{line} imports _runtime/{target}.py, which is not below it")
    assert wrong == []


def test_no_import_loop_inside_the_runtime_even_at_call_time() -> None:
    """No chain of runtime imports that run (at load or inside a function) leads from a module back to itself:
    an import moved into a function to dodge a circle still counts."""
    graph = {name: {target for target, _ in _runtime_imports(path)} for name, path in _runtime_modules().items()}
    loops = []
    for start in sorted(graph):
        seen: set[str] = set()
        todo = list(graph[start])
        while todo:
            name = todo.pop()
            if name == start:
                loops.append(start)
                break
            if name not in seen:
                seen.add(name)
                todo.extend(graph.get(name, ()))
    assert loops == [], f"these runtime modules import themselves through others: {loops}"


def _named_modules(path: Path) -> list[str]:
    """The wfsub modules one file imports, with the submodules it takes by name (`from .._store import _group`)."""
    here = list(path.relative_to(PACKAGE).with_suffix("").parts[:-1])
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.extend(a.name.removeprefix("wfsub.") for a in node.names if a.name.startswith("wfsub."))
            continue
        for target in _targets(node, here):
            found.append(target)
            if isinstance(node, ast.ImportFrom) and node.module:
                folder = PACKAGE.joinpath(*target.split("."))
                found.extend(
                    f"{target}.{a.name}" for a in node.names
                    if (folder / f"{a.name}.py").exists() or (folder / a.name).is_dir()
                )
    return found


def test_no_layer_imports_another_layers_private_module() -> None:
    """A layer reaches another only through its face (the package's `__init__`, or the module a layer is): never
    a private module inside it, so a layer's insides can move without its users following."""
    wrong = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        layer = rel.parts[0].removesuffix(".py")
        if layer not in LAYERS:
            continue
        for target in _named_modules(path):
            parts = target.split(".")
            if parts[0] != layer and parts[0] in LAYERS and any(part.startswith("_") for part in parts[1:]):
                wrong.append(f"{rel} imports {target}: export what it needs from wfsub.{parts[0]} and import it there")
    assert wrong == []


def test_the_command_and_contrib_use_only_the_public_api() -> None:
    """wfsub/cli and wfsub/contrib import no private module of wfsub (their own modules aside): what they need
    is public, in `wfsub`, `wfsub.lowlevel`, `wfsub.stores`, `wfsub.terms`, ..."""
    wrong = []
    for front in ("cli", "contrib"):
        for path in (PACKAGE / front).rglob("*.py"):
            for target in _imports(path):
                parts = target.split(".")
                if parts[0] != front and any(part.startswith("_") for part in parts):
                    wrong.append(f"{path.relative_to(PACKAGE)} imports {target}")
    assert wrong == []


def test_every_term_kind_has_a_check_and_an_emitter() -> None:
    """Each term class has its validation check and its compiler emitter (both tables are built by name)."""
    kinds = set(term_classes())
    assert kinds and set(_CHECKS) == kinds and set(_EMIT) == kinds


def test_every_opcode_has_a_handler_and_an_operand_kind() -> None:
    """The dispatch tuple has one handler per opcode, named after it, and `OPERANDS` describes each opcode."""
    assert len(HANDLERS) == len(Op)
    for op in Op:
        assert HANDLERS[op].__name__ == f"_op_{op.name.lower()}"
    assert set(OPERANDS) == set(Op)


def test_a_handler_table_that_leaves_an_opcode_out_fails_at_import() -> None:
    """The table of handlers is written out by hand: one missing an opcode raises ImportError naming it."""
    with pytest.raises(ImportError, match="opcode SAGA_STEP: add it to HANDLERS"):
        _table({op: handler for op, handler in zip(Op, HANDLERS, strict=True) if op is not Op.SAGA_STEP})


async def _noop(ctx: Any) -> None:
    return None


def _bump(key: str) -> Any:
    return task(lambda c: {key: c.get(key, 0) + 1}, name=f"bump_{key}")


EVERYTHING = seq(
    scope(
        "outer",
        par(
            interleave(critical("L", seq(_bump("a"), effect(_noop, name="fx"))), scope("s", sleep(1))),
            mi(seq(wait("go"), _bump("m")), count=2, join="all", name="many", collect="outs"),
            loop(_bump("l"), times=2),
            multi_choice(
                (lambda c: True, milestone("M", wait("ms"))), (lambda c: True, when_milestone("M", _bump("w")))
            ),
            xor((lambda c: True, call("sub")), default=_bump("x")),
            defer({"d": _bump("d")}, timeout=5, on_timeout=_bump("t")),
            scope("err", saga((_bump("s1"), _bump("c1")), task(lambda c: 1 / 0)), on_error=_bump("handled")),
            net(
                {"na": _bump("na"), "nb": wait("nw"), "nj": _bump("nj")},
                [("start", "na"), ("start", "nb"), ("na", "nj"), ("nb", "nj"), ("nj", "end")],
                join={"nj": "or"},
            ),
        ),
    ),
    _bump("end"),
)
LIBRARY = {"sub": seq(_bump("in_sub"), wait("sub_go"))}


def test_every_record_class_round_trips_through_a_snapshot() -> None:
    """Snapshots taken while a workflow holds every kind of vm record restore to the same state, record for record."""
    m = Machine(wfsub.compile(EVERYTHING, library=LIBRARY), trace_level="min")
    seen: set[str] = set()
    for step in range(200):
        r = m.run(1)
        snap = json.loads(json.dumps(m.snapshot()))
        seen |= {obj["type"] for obj in snap["objects"]}
        again = Machine.restore(m.program, snap)
        assert json.loads(json.dumps(again.snapshot())) == snap, f"step {step}"
        if r.status in ("done", "failed", "cancelled"):
            break
        if r.status == "blocked":  # answer the oldest effect, else the oldest timer, else a signal
            if m.effect_ids():
                m.complete_effect(m.effect_ids()[0], {"e": 1})
            elif m.timer_ids():
                m.fire_timer(m.timer_ids()[0])
            else:
                m.deliver_signal(sorted(r.signals)[0], 1)
    assert m.status == "done", m.error_message
    seen |= _bulk_records()
    assert seen == set(record_classes())


def _bulk_records() -> set[str]:
    """The record types a snapshot holds while a big dynamic mi starts count= instances with items added behind
    them, and while a durable case holds its task outputs encoded for the digest; each round-trips."""
    from wfsub._program import SPAWN_CHUNK
    from wfsub._vm._machine import FOLD_AT

    n = FOLD_AT + 2 * SPAWN_CHUNK
    m = Machine(wfsub.compile(mi(task(lambda c: {"i": c["index"]}), count=n, dynamic=True, name="grow")),
                max_instances=2 * n)
    m.digesting = True
    seen: set[str] = set()
    m.run(1)  # the first chunk, and the spawner queued behind it
    m.add_instances("grow", ["added"])  # queued behind the count= instances still to start
    while True:
        snap = json.loads(json.dumps(m.snapshot()))
        seen |= {obj["type"] for obj in snap["objects"]}
        again = Machine.restore(m.program, snap)
        assert json.loads(json.dumps(again.snapshot())) == snap
        if m.run(1000).status != "yielded":
            break
    assert m.status == "done", m.error_message
    return seen | _update_records()


def _update_records() -> set[str]:
    """The record types a snapshot holds while a thread owes an update (it waits for its own effect)."""
    m = Machine(wfsub.compile(seq(wait("u"), effect(_noop, name="fx"), reply("u", lambda c: 1))))
    m.run(100)
    m.deliver_update("u", None, "id")
    m.run(100)
    snap = json.loads(json.dumps(m.snapshot()))
    again = Machine.restore(m.program, snap)
    assert json.loads(json.dumps(again.snapshot())) == snap
    again.complete_effect(again.effect_ids()[0], {})
    again.run(100)
    assert again.take_answers() == [("id", "answer", "u", 1)]
    return {obj["type"] for obj in snap["objects"]}


def test_every_event_kind_the_vm_emits_is_listed() -> None:
    """Each kind passed to _trace_node/_case_event/emit in the vm is in MIN_KINDS or FULL_KINDS, with its comment."""
    from wfsub._vm._events import FULL_KINDS

    emitted: set[str] = set()
    for path in (PACKAGE / "_vm").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("_trace_node", "_case_event", "emit")
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                emitted.add(node.args[0].value)
    assert emitted and sorted(emitted - FULL_KINDS) == []
