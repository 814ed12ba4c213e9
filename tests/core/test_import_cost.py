"""What `import wfsub` and `wfsub --help` load: only what they use, each checked in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# Never loaded by `import wfsub`: the logging library and its console renderer (structlog.dev pulls in rich and
# pygments), the command and its libraries, the Postgres driver and store, the diagrams, the extras, and the
# runtime's own dependencies (pydantic, anyio), which load with the first name that needs them.
NOT_ON_IMPORT = (
    "structlog", "structlog.dev", "rich", "pygments", "click", "asyncpg", "opentelemetry", "pydantic", "anyio",
    "wfsub._store._postgres", "wfsub.contrib.diagram", "wfsub._diagram", "wfsub._runtime", "wfsub._store",
    "wfsub._trace", "wfsub._compiler", "wfsub._vm", "wfsub.cli",
)
# Never loaded by a Substrate, unless the app uses them: structlog is the app's to import and configure.
NOT_WITH_THE_RUNTIME = (
    "structlog", "rich", "pygments", "click", "asyncpg", "opentelemetry", "wfsub._store._postgres",
    "wfsub.contrib.diagram", "wfsub._diagram", "wfsub.cli",
)
# Never loaded by `wfsub --help`: the runtime, the stores, the compiler, the vm, pydantic and Rich.
NOT_FOR_HELP = (
    "structlog", "rich", "pygments", "pydantic", "asyncpg", "wfsub._runtime", "wfsub._store", "wfsub._trace",
    "wfsub._compiler", "wfsub._vm", "wfsub._validate", "wfsub.contrib.diagram", "wfsub._diagram",
)


def _loaded(code: str, watched: tuple[str, ...]) -> list[str]:
    """Run `code` in a fresh interpreter; the modules of `watched` it left in sys.modules (lazy ones unloaded)."""
    probe = (
        f"{code}\n"
        "import json, sys\n"
        "def _real(name):\n"  # a module registered by importlib.util.LazyLoader and never used was not loaded
        "    module = sys.modules.get(name)\n"
        "    return module is not None and type(module).__name__ != '_LazyModule'\n"
        f"print(json.dumps(sorted(m for m in {watched!r} if _real(m))))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    loaded: list[str] = json.loads(done.stdout.splitlines()[-1])
    return loaded


def test_import_wfsub_loads_nothing_optional() -> None:
    """`import wfsub` loads the errors and the algebra: no structlog, rich, click, pydantic, Postgres or diagrams."""
    assert _loaded("import wfsub", NOT_ON_IMPORT) == []


def test_terms_build_without_loading_the_runtime() -> None:
    """Building terms with `wfsub.seq`, `wfsub.task` and the like loads neither the runtime nor pydantic."""
    code = "import wfsub\nwfsub.seq(wfsub.task(lambda c: None, name='a'), wfsub.wait('go'))"
    assert _loaded(code, NOT_ON_IMPORT) == []


@pytest.mark.parametrize("name", ["Substrate", "CaseStatus", "TraceEvent", "MemorySink", "StructlogSink", "compile"])
def test_the_runtime_loads_on_first_use_without_structlog_postgres_or_the_command(name: str) -> None:
    """The first use of a runtime name loads the runtime, but not structlog, rich, Postgres, diagrams or click."""
    assert _loaded(f"import wfsub\nassert wfsub.{name} is not None", NOT_WITH_THE_RUNTIME) == []


def test_a_lazy_name_is_the_same_object_as_in_its_home_module() -> None:
    """`wfsub.Substrate`, `wfsub.compile` and `wfsub.to_mermaid` are the objects of the modules that define them."""
    from wfsub import Substrate, compile, to_mermaid
    from wfsub._compiler import compile_workflow
    from wfsub._runtime._substrate import Substrate as home_substrate
    from wfsub.contrib.diagram import to_mermaid as home_to_mermaid

    assert (Substrate, compile, to_mermaid) == (home_substrate, compile_workflow, home_to_mermaid)


def test_diagrams_load_on_first_use() -> None:
    """`wfsub.to_mermaid` loads the diagram module when it is first read, and not the runtime."""
    code = "import sys, wfsub\nassert 'wfsub._diagram' not in sys.modules\nwfsub.to_mermaid"
    assert _loaded(code, ("wfsub._diagram", "wfsub._runtime", "pydantic")) == ["wfsub._diagram"]


def test_postgres_store_loads_only_when_named() -> None:
    """`wfsub.stores` does not load the Postgres store module; `wfsub.stores.PostgresStore` does (not asyncpg)."""
    assert _loaded("import wfsub.stores", ("wfsub._store._postgres", "asyncpg")) == []
    code = "import wfsub.stores\nwfsub.stores.PostgresStore"
    assert _loaded(code, ("wfsub._store._postgres", "asyncpg")) == ["wfsub._store._postgres"]


def test_structlog_is_used_when_the_app_configured_it() -> None:
    """An app that imports and configures structlog gets wfsub's events through it, as before it was lazy."""
    code = (
        "import structlog, logging, wfsub\n"
        "from wfsub._trace import get_logger\n"
        "seen = []\n"
        "structlog.configure(processors=[lambda _, __, event: seen.append(event) or ''],"
        " logger_factory=structlog.ReturnLoggerFactory())\n"
        "get_logger('wfsub.runtime').info('hello', case_id='c1')\n"
        "assert seen and seen[0]['event'] == 'hello' and seen[0]['case_id'] == 'c1', seen\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_wfsub_help_loads_no_runtime_store_or_rich() -> None:
    """`wfsub --help` lists the commands after loading click alone: no runtime, store, compiler, pydantic or Rich."""
    code = (
        "import contextlib, io, runpy, sys\n"
        "sys.argv = ['wfsub', '--help']\n"
        "text = io.StringIO()\n"
        "with contextlib.redirect_stdout(text), contextlib.suppress(SystemExit):\n"
        "    runpy.run_module('wfsub', run_name='__main__')\n"
        "assert 'Usage: wfsub' in text.getvalue() and 'replay' in text.getvalue(), text.getvalue()\n"
    )
    assert _loaded(code, NOT_FOR_HELP) == []


def test_a_commands_state_choice_lists_the_case_states() -> None:
    """`--state` offers exactly the CaseState values, read when the option is first used."""
    from click.testing import CliRunner

    from wfsub import CaseState
    from wfsub.cli import main

    states = [s.value for s in CaseState]
    shown = CliRunner().invoke(main, ["cases", "--help"], terminal_width=400)
    assert f"[{'|'.join(states)}]" in shown.output
    refused = CliRunner().invoke(main, ["cases", "x.db", "--state", "nope"])
    assert refused.exit_code == 2
    assert all(repr(s) in refused.output for s in states)
