"""The cpu board's box probe: any box with a LiteRT interpreter is one."""
from __future__ import annotations

from edgehft.deploy.probe_rules import litert_missing


def probe(board, facts: dict) -> list[str]:
    """Why the box in ``facts`` is not the cpu ``board``: no LiteRT interpreter installed (else ``[]``)."""
    return litert_missing(facts)
