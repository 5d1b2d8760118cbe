"""The Jetson boards' box probe: the L4T release file and the device-tree module name. A Jetson runs on
TensorRT, so it needs no LiteRT interpreter."""
from __future__ import annotations

import re
from pathlib import Path

from edgehft.deploy.probe_rules import read_text
from edgehft.compat import removeprefix


def parse_l4t(text: str | None) -> str | None:
    """``/etc/nv_tegra_release`` first line → ``"36.4.0"`` (None when it is not an L4T release file)."""
    m = re.search(r"#\s*R(\d+)\s*\(release\),\s*REVISION:\s*([\d.]+)", text or "")
    return f"{m.group(1)}.{m.group(2)}" if m else None


def facts(root: Path) -> dict:
    """``{"l4t", "device_tree_model"}``: the L4T release from ``root/etc/nv_tegra_release`` (``36.4.0``) and
    the module name in ``root/proc/device-tree/model``; None where absent."""
    return {"l4t": parse_l4t(read_text(root / "etc/nv_tegra_release")),
            "device_tree_model": read_text(root / "proc/device-tree/model")}


def probe(board, facts: dict) -> list[str]:
    """Why the box in ``facts`` is not the Jetson ``board``: no L4T release (``facts["l4t"]`` None), a release
    that does not start with the board file's ``runtime.l4t``, or a ``device_tree_model`` that lacks a word of
    the board name after ``jetson-``."""
    why = []
    rt = board.runtime
    l4t, model = facts.get("l4t"), facts.get("device_tree_model") or ""
    want = str(rt.get("l4t", ""))
    if l4t is None:
        why.append("no /etc/nv_tegra_release: not a Jetson (L4T) system")
    elif want and not (l4t == want or l4t.startswith(want + ".")):
        why.append(f"L4T {l4t}, {board.name} is defined for L4T {want} (JetPack {rt.get('jetpack', '?')})")
    words = removeprefix(board.name, "jetson-").split("-")
    if l4t is not None and not all(w.lower() in model.lower().split() for w in words):
        why.append(f"module is {model or 'unknown'!r}, not a Jetson {' '.join(words)}")
    return why


def identity(facts: dict) -> list[str]:
    """``["l4t 36.4.0", "device_tree_model NVIDIA Jetson ..."]``: what ``facts`` say of an L4T system."""
    return [f"{k} {facts[k]}" for k in ("l4t", "device_tree_model") if facts.get(k)]
