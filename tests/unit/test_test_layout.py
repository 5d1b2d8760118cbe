"""The test tree's layout (tests/conftest.py GROUPS): every test file sits in one group's directory (none at the
top of tests/, none in an unknown directory), no two share a file name, and no module under tests/ imports a
test module (shared code lives in helper modules next to conftest.py). Collected by a fresh pytest, each test
carries its group's marker and no other group's, ``-m "not hw"`` drops exactly the hw tests, every hw test names
the hardware it needs, and a missing need skips its tests with the reason conftest gives."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from conftest import GROUPS, ROOT, TESTS, missing

TEST_FILES = sorted(TESTS.rglob("test_*.py"))

# A pytest plugin for the collecting subprocess: pretend g++ is missing (to see a need's skip), then write
# what was collected (node id, marker names, needs, skip reasons) as JSON to $LAYOUT_DUMP.
DUMP_PLUGIN = '''
import json, os, sys

def pytest_sessionstart(session):
    conftest = sys.modules["conftest"]
    assert conftest.__file__ == os.environ["LAYOUT_CONFTEST"], conftest.__file__
    conftest.NEEDS["g++"] = lambda: "pretend: no g++ here"

def pytest_collection_finish(session):
    rows = [{"nodeid": item.nodeid,
             "markers": sorted({m.name for m in item.iter_markers()}),
             "needs": [n for m in item.iter_markers("needs") for n in m.args],
             "skips": [m.kwargs.get("reason", "") for m in item.iter_markers("skip")]} for item in session.items]
    with open(os.environ["LAYOUT_DUMP"], "w") as f:
        json.dump(rows, f)
'''


def collected(tmp_path: Path, *args: str) -> list[dict]:
    """What ``pytest --collect-only ARGS`` (a fresh process, from the repository root) collects: one dict per
    test with its ``nodeid``, marker ``markers`` names, ``needs`` and ``skips`` (skip reasons)."""
    (tmp_path / "layout_dump.py").write_text(DUMP_PLUGIN)
    out = tmp_path / f"collected{len(list(tmp_path.glob('collected*')))}.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
           "LAYOUT_DUMP": str(out), "LAYOUT_CONFTEST": str(TESTS / "conftest.py")}
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                        "-p", "layout_dump", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(out.read_text())


def group_dir(nodeid: str) -> str:
    return nodeid.split("/")[1]


def test_every_test_file_is_in_a_group_directory():
    misplaced = [str(f.relative_to(TESTS)) for f in TEST_FILES
                 if len(f.relative_to(TESTS).parts) != 2 or f.relative_to(TESTS).parts[0] not in GROUPS]
    assert misplaced == []
    groups = Counter(f.relative_to(TESTS).parts[0] for f in TEST_FILES)
    assert sorted(groups) == sorted(GROUPS)                     # no group left empty
    assert not list(TESTS.glob("test_*.py"))                    # nothing left at the top


def test_test_file_names_are_unique():
    names = Counter(f.name for f in TEST_FILES)
    assert [n for n, k in names.items() if k > 1] == []


def test_no_module_imports_a_test_module():
    found = []
    for f in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            mods = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                    [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            found += [f"{f.relative_to(TESTS)}:{node.lineno} imports {m}" for m in mods
                      if m.split(".")[0].startswith("test_")]
    assert found == []


@pytest.fixture(scope="module")
def everything(tmp_path_factory) -> list[dict]:
    return collected(tmp_path_factory.mktemp("layout"))


def test_each_test_carries_its_groups_marker_only(everything):
    wrong = [(t["nodeid"], sorted(set(t["markers"]) & set(GROUPS))) for t in everything
             if sorted(set(t["markers"]) & set(GROUPS)) != [group_dir(t["nodeid"])]]
    assert wrong == []
    per_group = Counter(group_dir(t["nodeid"]) for t in everything)
    assert all(per_group[g] > 0 for g in GROUPS if g != "board")    # tests/board collects in .venv-board only


def test_marker_selection_drops_exactly_the_hw_tests(everything, tmp_path):
    kept = {t["nodeid"] for t in collected(tmp_path, "-m", "not hw")}
    assert kept == {t["nodeid"] for t in everything if group_dir(t["nodeid"]) != "hw"}


def test_hw_tests_name_what_they_need_and_skip_without_it(everything):
    hw = [t for t in everything if group_dir(t["nodeid"]) == "hw"]
    assert hw and all(t["needs"] for t in hw)
    for t in hw:
        reasons = [missing(n) for n in t["needs"] if missing(n) is not None]
        assert bool(t["skips"]) == bool(reasons), t
        assert all(r in " ".join(t["skips"]) for r in reasons), t


def test_a_missing_need_skips_its_tests_with_the_reason(everything):
    needing = [t for t in everything if "g++" in t["needs"]]
    assert any("tests/unit/test_native_conv.py::" in t["nodeid"] for t in needing)
    assert all("pretend: no g++ here" in " ".join(t["skips"]) for t in needing)
    assert not any("pretend: no g++ here" in " ".join(t["skips"]) for t in everything if "g++" not in t["needs"])


def test_an_unknown_need_is_refused_by_name():
    with pytest.raises(KeyError, match="unknown need 'gpp': say one of g\\+\\+, board-venv"):
        missing("gpp")
