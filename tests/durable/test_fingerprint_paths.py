"""Fingerprints do not depend on how a module was imported: one file reached as `loan_wfsub` and as
`app_pkg.loan_wfsub` (two entries of sys.path) gives one fingerprint, so a case started by one runs on the other
without a migration; two functions of one name with other code still differ."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

import wfsub
from wfsub import Substrate

from ._util import kinds

LOAN = '''
from wfsub import seq, task, wait


def score(ctx):
    return {"score": ctx["amount"] % 7}


def pay(ctx):
    return {"paid": ctx["amount"]}


LOAN = seq(task(score), wait("approve", into="approve"), task(pay))
'''

OTHER = LOAN.replace('{"paid": ctx["amount"]}', '{"paid": ctx["amount"] * 2}')  # same names, other code


@pytest.fixture
def two_paths(tmp_path: Path) -> Iterator[tuple[ModuleType, ModuleType]]:
    """The same file imported twice: as a top-level module and as a module of a package."""
    package = tmp_path / "app_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "loan_wfsub.py").write_text(LOAN)
    sys.path[:0] = [str(tmp_path), str(package)]
    try:
        top = importlib.import_module("loan_wfsub")
        nested = importlib.import_module("app_pkg.loan_wfsub")
        assert top is not nested and top.LOAN is not nested.LOAN
        yield top, nested
    finally:
        sys.path.remove(str(tmp_path))
        sys.path.remove(str(package))
        for name in ("loan_wfsub", "app_pkg.loan_wfsub", "app_pkg"):
            sys.modules.pop(name, None)


def test_one_file_imported_by_two_paths_gives_one_fingerprint(
    two_paths: tuple[ModuleType, ModuleType], tmp_path: Path
) -> None:
    """`loan_wfsub.LOAN` and `app_pkg.loan_wfsub.LOAN` compile to one fingerprint; edited code to another."""
    top, nested = two_paths
    assert top.score.__module__ == "loan_wfsub" and nested.score.__module__ == "app_pkg.loan_wfsub"
    assert wfsub.compile(top.LOAN).fingerprint == wfsub.compile(nested.LOAN).fingerprint
    (tmp_path / "other_pkg").mkdir()
    (tmp_path / "other_pkg" / "__init__.py").write_text("")
    (tmp_path / "other_pkg" / "loan_wfsub.py").write_text(OTHER)
    try:
        other = importlib.import_module("other_pkg.loan_wfsub")
        assert wfsub.compile(other.LOAN).fingerprint != wfsub.compile(top.LOAN).fingerprint
    finally:
        sys.modules.pop("other_pkg.loan_wfsub", None)
        sys.modules.pop("other_pkg", None)


async def test_a_case_started_under_one_import_path_runs_under_the_other_without_migrating(
    two_paths: tuple[ModuleType, ModuleType], tmp_path: Path
) -> None:
    """A case started by a Substrate that imported `loan_wfsub` resumes on one that imported `app_pkg.loan_wfsub`
    as the same version: no `version` record, `migrated_from` stays None."""
    top, nested = two_paths
    path = str(tmp_path / "loans.db")
    async with Substrate(store=path, workflows={"loan": top.LOAN}) as sub:
        await sub.new_case("loan", {"amount": 9}, case_id="l1")
    async with Substrate(store=path, workflows={"loan": nested.LOAN}) as sub:
        await sub.signal("l1", "approve", {"by": "ann"})
        assert await sub.await_case("l1", timeout=60) == {
            "amount": 9, "score": 2, "approve": {"by": "ann"}, "paid": 9,
        }
        status = sub.status("l1")
        journal = await sub.journal("l1")
    assert status.version == wfsub.compile(nested.LOAN).fingerprint and status.migrated_from is None
    assert kinds(journal) == ["start", "signal", "end"]
