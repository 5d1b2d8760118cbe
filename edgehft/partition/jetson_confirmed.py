"""The engine inspector's real per-layer placement, mapped back to ONNX nodes and laid next to the prediction
(layer 3 of the Jetson backend's report; the mapping itself needs no GPU).

Where the confirmed record lives, and why
-----------------------------------------
``edgehft build-engine`` writes one *placement record* per engine (:func:`record_for`, JSON) next to the
engine in the engine cache: ``<cache>/<key>.json`` beside ``<key>.engine`` (:mod:`edgehft.toolchains.tensorrt`),
``key`` being the engine cache key (TensorRT version, L4T release, module, DLA core, precision, model hash).
Each record carries the model's SHA-256 and precision; ``edgehft report BUNDLE`` uses the records whose
model hash and precision equal the bundle manifest's (:func:`find_records`), newest first, or a record file
passed with ``--engine-record`` (copied off the board). The bundle itself is never written: its signed
content (manifest + every listed file's SHA-256) stays what compile produced, ``verify`` passes, and
``report.json`` keeps the compile-time prediction. Rejected alternatives: rewriting ``report.json`` and
re-signing the manifest would make the bundle's identity depend on which board built an engine (one bundle
on two boards, or on two DLA cores, needs two different confirmed placements), and the deploy store on the
box treats ``versions/<vid>/`` as immutable and refuses files not in the manifest, so a sidecar inside the
bundle directory is out too. The cache record is where the runtime finds the engine it will run, so the
report shows the placement of exactly that engine.

The inspector's JSON format, and how its layers map to ONNX nodes, is :mod:`edgehft.ir.tensorrt_inspector`.
"""
from __future__ import annotations

import json
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

from edgehft.ir.tensorrt_inspector import inspector_layers, layer_device, layer_nodes  # noqa: F401 (API)
from edgehft.report import Report, Segment

RECORD_FORMAT = "edgehft-engine-placement"
def _runs(devices: list[str]) -> list[dict]:
    runs: list[dict] = []
    for k, d in enumerate(devices):
        if runs and runs[-1]["on"] == d:
            runs[-1]["nodes"].append(k)
        else:
            runs.append({"on": d, "nodes": [k]})
    return runs


def apply_record(rep: Report, record: dict, source: str) -> Report:
    """Lay the placement record over the predicted Jetson report ``rep`` (ops = ONNX nodes in graph order).

    Per op: ``confirmed`` (``DLA``, ``GPU`` or ``DLA+GPU`` when layers on both run it), ``confirmed_by`` (the
    engine layer names), ``verdict`` (``confirmed``, or ``predicted`` when no engine layer names the node:
    folded shape ops, constants, Q/DQ). ``disagreements`` lists nodes whose confirmed device is not the
    predicted one (``{"index", "op", "name", "predicted", "actual", "layer"}``). ``counts``, ``segments`` and
    ``boundary_copies`` follow the confirmed device where there is one. Returns a new report.
    """
    rep = rep.model_copy(deep=True)
    order = [op.layer or "" for op in rep.ops]
    index = {n: k for k, n in enumerate(order) if n}
    layers = record.get("layers") or []
    on: dict[int, set[str]] = {}
    by: dict[int, list[str]] = {}
    unmapped = []
    for lay in layers:
        nodes = layer_nodes(lay, index, order)
        if not nodes and not lay.get("glue"):
            unmapped.append(lay["name"])
        for k in nodes:
            on.setdefault(k, set()).add(lay["device"])
            by.setdefault(k, []).append(lay["name"])
    version = record.get("tensorrt", "?")
    rep.verdict = "confirmed"
    rep.verdict_source = f"TensorRT {version} engine inspector"
    dis, effective = [], []
    for op in rep.ops:
        predicted = op.kernel or "unsupported"
        if op.index in on:
            op.confirmed = "+".join(sorted(on[op.index]))
            op.verdict, op.confirmed_by = "confirmed", " | ".join(dict.fromkeys(by[op.index]))
            if op.confirmed != predicted:
                dis.append({"index": op.index, "op": op.op, "name": op.layer, "predicted": predicted,
                            "actual": op.confirmed, "layer": op.confirmed_by})
        else:
            op.confirmed, op.verdict, op.confirmed_by = None, "predicted", None
        effective.append((op.confirmed or predicted).lower())
    rep.disagreements = dis
    rep.counts = dict(Counter(effective))
    runs = _runs(effective)
    rep.segments = [Segment(index=k, placement="unsupported" if r["on"] == "unsupported" else "accelerator",
                            ops=r["nodes"]) for k, r in enumerate(runs)]
    rep.boundary_copies = max(0, len(runs) - 1)
    confirmed = sum(op.verdict == "confirmed" for op in rep.ops)
    dla = record.get("dla_core")
    eng = {"key": record.get("key"), "record": source, "tensorrt": version, "identity": record.get("identity"),
           "dla_core": dla, "precision": record.get("precision"), "built_utc": record.get("built_utc"),
           "engine": record.get("engine"), "layers": len(layers),
           "layer_devices": dict(Counter(lay["device"] for lay in layers if not lay.get("glue"))),
           "glue_layers": sum(bool(lay.get("glue")) for lay in layers), "unmapped_layers": unmapped,
           "confirmed_nodes": confirmed, "unconfirmed_nodes": [op.index for op in rep.ops if op.verdict != "confirmed"],
           "agreement": f"{confirmed - len(dis)}/{confirmed}", "runs": runs}
    rep.accelerator = {**rep.accelerator, "engine": eng}
    where = f"DLA core {dla} with GPU fallback" if dla is not None else "GPU only"
    head = (f"engine built by TensorRT {version} ({where}): the inspector names {confirmed} of {len(rep.ops)} ONNX "
            f"nodes; {confirmed - len(dis)} run where predicted"
            + (f", {len(dis)} elsewhere (see the disagreements)" if dis else ""))
    lines = [head]
    if confirmed < len(rep.ops):
        lines.append(f"{len(rep.ops) - confirmed} node(s) named by no engine layer (folded into neighbours or "
                     "renamed by TensorRT) keep their predicted placement, marked \"predicted\"")
    if unmapped:
        lines.append(f"{len(unmapped)} engine layer(s) map to no ONNX node: " + ", ".join(unmapped[:5])
                     + (" ..." if len(unmapped) > 5 else ""))
    rep.summary = lines + [f"predicted at compile: {s}" for s in rep.summary]
    return rep


def _load(path: Path) -> dict | None:
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


def _usable(rec: dict | None) -> bool:
    return bool(rec) and isinstance(rec.get("layers"), list) and all(isinstance(x, dict) and "name" in x
                                                                       and "device" in x for x in rec["layers"])


def find_records(bundle, explicit: list[str | Path] = ()) -> tuple[list[tuple[Path, dict]], list[str]]:
    """Placement records for ``bundle`` (an opened :class:`~edgehft.bundle.Bundle`), newest first: the files in
    ``explicit`` (``--engine-record``), then the engine-cache records with the bundle's model SHA-256 and
    precision. Returns ``(records, notes)``.

    Raises:
        InputError: an ``explicit`` file is unreadable, not a placement record, or made for another model
            or precision (cache records of other models are skipped silently: the cache is shared).
    """
    from edgehft.errors import InputError
    from edgehft.toolchains.tensorrt import cache_dir
    m = bundle.manifest
    sha, precision = m.files.get(m.model_file), m.quantization.mode
    found: dict[str, tuple[Path, dict]] = {}
    for p in map(Path, explicit):
        rec = _load(p)
        if not _usable(rec):
            raise InputError(f"{p} is not an engine placement record",
                             hint="pass the <key>.json that edgehft build-engine wrote next to the engine")
        if rec.get("model_sha256") != sha or rec.get("precision") != precision:
            raise InputError(f"{p} was made for another model or precision (model {str(rec.get('model_sha256'))[:12]}…, "
                             f"{rec.get('precision')}; the bundle has {str(sha)[:12]}…, {precision})",
                             hint="run edgehft build-engine on this bundle")
        found[rec.get("key") or p.stem] = (p, rec)
    cache = cache_dir()
    for p in sorted(cache.glob("*.json")) if cache.is_dir() else []:
        rec = _load(p)
        if (_usable(rec) and (rec.get("key") or p.stem) not in found and rec.get("model_sha256") == sha
                and rec.get("precision") == precision):
            found[rec.get("key") or p.stem] = (p, rec)

    def when(item):
        p, rec = item
        return str(rec.get("built_utc") or datetime.fromtimestamp(p.stat().st_mtime, timezone.utc).isoformat())
    records = sorted(found.values(), key=when, reverse=True)
    return records, ([f"engine records read from {cache}"] if records and not explicit else [])


def confirmed_report(bundle, rep: Report, explicit: list[str | Path] = ()) -> Report:
    """The Jetson bundle's report with the newest applicable placement record laid over it
    (:func:`apply_record`), or, with none, every op marked ``verdict="predicted"`` and a note saying how to
    confirm. Other applicable records (another DLA core, another box) are listed in
    ``accelerator["engine"]["other_records"]``. Raises InputError as :func:`find_records`."""
    records, notes = find_records(bundle, explicit)
    if not records:
        rep = rep.model_copy(deep=True)
        for op in rep.ops:
            op.verdict, op.confirmed, op.confirmed_by = "predicted", None, None
        rep.accelerator = {**rep.accelerator, "engine": None}
        rep.notes = rep.notes + ["no engine built for this bundle on this box: the placement is predicted; "
                                 "`edgehft build-engine BUNDLE` on the board confirms it (or pass --engine-record)"]
        return rep
    (path, rec), others = records[0], records[1:]
    out = apply_record(rep, rec, str(path))
    out.accelerator["engine"]["other_records"] = [
        {"record": str(p), "dla_core": r.get("dla_core"), "tensorrt": r.get("tensorrt"), "built_utc": r.get("built_utc")}
        for p, r in others]
    out.notes = out.notes + notes + ([f"{len(others)} other engine record(s) for this model (see --json "
                                      "accelerator.engine.other_records); showing the newest"] if others else [])
    return out


def record_for(*, key: str, board: str, bundle: str, version: str, identity: dict, dla_core: int | None,
               precision: str, model_sha256: str, layers: list[dict], engine: str | None = None) -> dict:
    """The placement record ``build-engine`` writes next to the engine in the cache: what the engine depends on, when it
    was built, and the normalized inspector layers (:func:`inspector_layers`)."""
    return {"format": RECORD_FORMAT, "format_version": 1, "key": key, "bundle": bundle, "board": board,
            "tensorrt": version, "identity": identity, "dla_core": dla_core, "precision": precision,
            "model_sha256": model_sha256, "built_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "engine": engine, "layers": layers, "verdict": "confirmed",
            "source": f"TensorRT {version} engine inspector"}


__all__ = ["apply_record", "confirmed_report", "find_records", "inspector_layers", "layer_device", "layer_nodes",
           "record_for"]

