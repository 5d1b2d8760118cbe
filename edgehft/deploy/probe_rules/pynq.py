"""The PYNQ boards' box probe: the ``BOARD`` variable the PYNQ image sets names the board."""
from __future__ import annotations

import os
import re
from pathlib import Path

from edgehft.deploy.probe_rules import litert_missing, read_text


def facts(root: Path) -> dict:
    """``{"pynq_board"}``: the ``BOARD`` the PYNQ image sets (this process's environment when ``root`` is
    ``/``, else ``root/etc/environment``), or None."""
    if root == Path("/") and os.environ.get("BOARD"):
        return {"pynq_board": os.environ["BOARD"]}
    text = read_text(root / "etc/environment") or ""
    m = re.search(r"^\s*BOARD=\"?([^\"\n]+)\"?", text, re.M)
    return {"pynq_board": m.group(1).strip() if m else None}


def probe(board, facts: dict) -> list[str]:
    """Why the box in ``facts`` is not the PYNQ ``board``: no LiteRT interpreter (CPU segments, golden
    checks), or ``facts["pynq_board"]`` (the image's ``BOARD``) is not the board file's ``runtime.pynq_board``."""
    why = litert_missing(facts)
    want, got = board.runtime.get("pynq_board"), facts.get("pynq_board")
    if got != want:
        why.append(f"PYNQ board is {got or 'not set (no BOARD in the environment: not a PYNQ image)'}, "
                   f"{board.name} needs {want}")
    return why


def identity(facts: dict) -> list[str]:
    """``["pynq_board Pynq-Z2"]`` when ``facts`` name a PYNQ board, else ``[]``."""
    return [f"pynq_board {facts['pynq_board']}"] if facts.get("pynq_board") else []
