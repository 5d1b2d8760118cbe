"""The Coral boards' box probe: an Edge TPU on the board's bus (USB ids or the gasket driver's PCIe nodes)."""
from __future__ import annotations

from pathlib import Path

from edgehft.deploy.probe_rules import litert_missing, read_text

EDGETPU_USB_IDS = {("1a6e", "089a"), ("18d1", "9302")}   # before the runtime loads its firmware, after


def facts(root: Path) -> dict:
    """``{"edgetpu": {"usb": n, "pci": n}}``: Edge TPUs under ``root`` on USB (``sys/bus/usb/devices/*``
    idVendor:idProduct) and on PCIe (``dev/apex_N``, the gasket driver's nodes)."""
    usb = 0
    devices = root / "sys/bus/usb/devices"
    if devices.is_dir():
        for d in devices.iterdir():
            usb += (read_text(d / "idVendor"), read_text(d / "idProduct")) in EDGETPU_USB_IDS
    dev = root / "dev"
    pci = len(list(dev.glob("apex_*"))) if dev.is_dir() else 0
    return {"edgetpu": {"usb": usb, "pci": pci}}


def probe(board, facts: dict) -> list[str]:
    """Why the box in ``facts`` is not the Coral ``board``: no LiteRT interpreter (CPU segments, golden
    checks), or no Edge TPU counted in ``facts["edgetpu"]`` on the board file's ``runtime.device`` bus."""
    why = litert_missing(facts)
    bus = str(board.runtime.get("device", "usb")).split(":")[0]
    if facts.get("edgetpu", {}).get(bus, 0) < 1:
        why.append(f"no Edge TPU on {bus.upper()} (found: {facts.get('edgetpu')})")
    return why


def identity(facts: dict) -> list[str]:
    """``["Edge TPU usb 1 pci 0"]`` when ``facts`` count an Edge TPU on either bus, else ``[]``."""
    tpus = facts.get("edgetpu") or {}
    return [f"Edge TPU usb {tpus.get('usb', 0)} pci {tpus.get('pci', 0)}"] if any(tpus.values()) else []


def attached() -> tuple[dict, list[str]]:
    """The Edge TPUs attached to this machine, through the installed runtime library
    (:func:`edgehft.runtime.coral_device.probe`): ``({"edgetpu": probe}, lines)``, the lines naming the library,
    its version and each device, or why there is none (and a hint)."""
    from edgehft.runtime.coral_device import probe as edgetpu_probe
    e = edgetpu_probe()
    if e.get("library"):
        devs = ", ".join(f"{d['name']} ({d['path']})" for d in e.get("devices", [])) or "none attached"
        lines = [f"Edge TPU runtime {e.get('runtime_version')} at {e['library']}: {devs}"]
    else:
        lines = [f"Edge TPU: {e.get('error') or 'runtime library not installed'}"]
        if e.get("hint"):
            lines.append(f"  hint: {e['hint']}")
    return {"edgetpu": e}, lines
