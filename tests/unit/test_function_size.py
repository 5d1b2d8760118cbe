"""Small functions (issue 14): no function or method in edgehft/ runs over :data:`LIMIT` lines (``def`` line to
its last line, decorators not counted) unless the line right above its ``def``, or above its first
decorator, is a comment ``# long: <reason>`` with a reason. Checked on the source (nothing is imported)."""
from __future__ import annotations

import ast
import re

from conftest import ROOT

PKG = ROOT / "edgehft"
LIMIT = 80
_MARK = re.compile(r"^\s*# long: \S")


def long_functions(source: str, limit: int = LIMIT) -> list[tuple[str, int, int]]:
    """``(name, def line, length in lines)`` of each function in ``source`` longer than ``limit`` lines
    and not marked ``# long: <reason>`` on the line above its ``def`` or its first decorator."""
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        length = node.end_lineno - node.lineno + 1
        if length <= limit:
            continue
        tops = {node.lineno, min([d.lineno for d in node.decorator_list] + [node.lineno])}
        if any(top >= 2 and _MARK.match(lines[top - 2]) for top in tops):
            continue
        found.append((node.name, node.lineno, length))
    return found


def _body(n: int) -> str:
    return "".join(f"    x{i} = {i}\n" for i in range(n))


def test_the_check_finds_an_unmarked_long_function_and_accepts_a_marked_one():
    long_def = "def f():\n" + _body(LIMIT)                       # LIMIT + 1 lines
    assert long_functions(long_def) == [("f", 1, LIMIT + 1)]
    assert long_functions("def f():\n" + _body(LIMIT - 1)) == []  # exactly LIMIT lines
    assert long_functions("import os\n# long: one table, read top to bottom\n" + long_def) == []
    decorated = "import functools\n# long: a reason\n@functools.lru_cache\n" + long_def
    assert long_functions(decorated) == []
    assert long_functions("# long:\n" + long_def) == [("f", 2, LIMIT + 1)]          # a reason is required
    assert long_functions("# long: far away\n\n" + long_def) == [("f", 3, LIMIT + 1)]
    method = "class C:\n    def m(self):\n" + "".join(f"        y{i} = {i}\n" for i in range(LIMIT))
    assert long_functions(method) == [("m", 2, LIMIT + 1)]


def test_no_function_in_edgehft_is_over_the_limit_without_a_reason():
    over = [f"{f.relative_to(PKG.parent)}:{line} {name} ({n} lines)"
            for f in sorted(PKG.rglob("*.py")) for name, line, n in long_functions(f.read_text())]
    assert not over, (f"functions over {LIMIT} lines: split them along their steps, or put "
                      "'# long: <reason>' on the line above the def: " + "; ".join(over))
