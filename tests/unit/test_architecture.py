"""The package's shape, checked on its source (no imports run): no import cycles between edgehft's modules,
lazy imports inside functions included (a cycle hidden in a function is still a cycle in the design), and
no private name (``_x``) imported from another module. A new cycle or private import fails here with the
modules named."""
from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT

PKG = ROOT / "edgehft"


def _modules() -> dict[str, Path]:
    mods = {}
    for f in PKG.rglob("*.py"):
        parts = f.relative_to(PKG.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = f
    return mods


def _target(name: str, mods: dict) -> str | None:
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def _imports(mods: dict) -> tuple[dict[str, set[str]], list[str]]:
    """Module -> the edgehft modules it imports (anywhere in its source), and the private names imported."""
    graph, private = {m: set() for m in mods}, []
    for m, f in mods.items():
        package = m if f.name == "__init__.py" else m.rpartition(".")[0]
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                if not base.startswith("edgehft"):
                    continue
                private += [f"{m}: from {base} import {a.name}" for a in node.names
                            if a.name.startswith("_") and not a.name.startswith("__")]
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            for n in names:
                t = _target(n, mods) if n.startswith("edgehft") else None
                if t and t != m:
                    graph[m].add(t)
    return graph, private


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root), on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w), on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_import_cycles():
    graph, _ = _imports(_modules())
    assert _cycles(graph) == []


def test_the_checker_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_private_names_imported_across_modules():
    _, private = _imports(_modules())
    assert private == []
