"""The Coral boards' box probe: an Edge TPU on the board's bus (USB ids or the gasket driver's PCIe nodes)."""
from __future__ import annotations

from edgehft.deploy.probe_rules import litert_missing


def probe(board, facts: dict) -> list[str]:
    """Why the box in ``facts`` is not the Coral ``board``: no LiteRT interpreter (CPU segments, golden
    checks), or no Edge TPU counted in ``facts["edgetpu"]`` on the board file's ``runtime.device`` bus."""
    why = litert_missing(facts)
    bus = str(board.runtime.get("device", "usb")).split(":")[0]
    if facts.get("edgetpu", {}).get(bus, 0) < 1:
        why.append(f"no Edge TPU on {bus.upper()} (found: {facts.get('edgetpu')})")
    return why
