"""Each backend's box probe, in two parts named by its :class:`edgehft.backends.Backend`: ``facts(root) ->
dict``, the facts that identify its boards, read on the box under ``root`` (merged into
:func:`edgehft.deploy.probe.probe_box`'s), and ``probe(board, facts) -> list[str]``, why the box described in
``facts`` is not ``board`` (empty when it is), run on the host. One module per built-in backend; a plugin
names its own.

The rules live here, next to the probe that gathers the facts they read, rather than in the runtime
modules: they are pure functions of the facts and the board TOML, run on the host during ``edgehft deploy``,
and must not import a vendor library or a runtime. Runs on old Pythons too: no new syntax.
"""
from __future__ import annotations

from pathlib import Path


def read_text(path: Path) -> str | None:
    """``path``'s text without trailing NULs, newlines and blanks (device-tree strings end in NUL), or None
    when it cannot be read."""
    try:
        return path.read_text(errors="replace").strip("\x00\n ")
    except OSError:
        return None


def litert_missing(facts: dict) -> list[str]:
    """``["no LiteRT interpreter ..."]`` when ``facts["packages"]`` has neither ai-edge-litert nor
    tflite-runtime, else ``[]``: every box that runs CPU segments or golden checks on LiteRT needs one."""
    pk = facts.get("packages", {})
    if "ai-edge-litert" in pk or "tflite-runtime" in pk:
        return []
    return ["no LiteRT interpreter on the box (pip install ai-edge-litert, or tflite-runtime)"]
