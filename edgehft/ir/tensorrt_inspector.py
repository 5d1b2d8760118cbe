"""TensorRT's engine inspector output, read: per-layer device (DLA or GPU) and the ONNX nodes each layer runs.
Ground floor (a vendor format, like the TFLite flatbuffer in :mod:`edgehft.ir.tflite_model`): used by the
engine builder (:mod:`edgehft.toolchains.tensorrt`) and the confirmed report
(:mod:`edgehft.partition.jetson_confirmed`); needs no GPU and no TensorRT.

Inspector format (sources, checked late 2026; nothing here has read a real engine's output)
------------------------------------------------------------------------------------------
* ``IEngineInspector.get_engine_information(LayerInformationFormat.JSON)`` returns one JSON object with a
  ``"Layers"`` list and (newer versions) ``"Bindings"``; with ``ProfilingVerbosity.DETAILED`` each layer is an
  object with ``"Name"``, ``"LayerType"``, ``"Inputs"``/``"Outputs"`` (``"Name"``, ``"Dimensions"``,
  ``"Format/Datatype"``), often ``"ParameterType"`` and ``"TacticName"``/``"TacticValue"``; with
  ``LAYER_NAMES_ONLY`` the layers are bare strings (NVIDIA TensorRT Python API, ``EngineInspector``; an
  example dump in pytorch/pytorch PR #66683; TREx's ``trex/parser.py`` in NVIDIA/TensorRT reads the same two
  keys and asks for DETAILED when layers are strings).
* GPU fusions join layer names with ``" + "``; pointwise fusions read ``PWN(PWN(a), b)`` (same PR).
* A region compiled by a foreign backend is one layer named ``{ForeignNode[first...last]}`` (or
  ``{ForeignNode[only]}``) naming the first and last ONNX node of the region. TensorRT's build log lists DLA
  regions as ``[DlaLayer] {ForeignNode[...]}`` (NVIDIA's sample_cudla README; NVIDIA/TensorRT issue #3143
  shows the DLA profile of such a layer), but Myelin regions on the *GPU* carry the same kind of name
  (trtexec profiles and "Could not find any implementation for node {ForeignNode[...]}" build errors), so a
  ForeignNode counts as DLA only in an engine built with a DLA core and when its type does not say Myelin.
  The exact ``LayerType`` of a DLA layer in the inspector JSON was not found in public sources: any layer
  whose type, parameter type or tactic mentions "DLA" counts as DLA too. This is the unverified part.
* Since TensorRT 8.6 layers carry ``"Metadata"``: the ONNX parser (onnx-tensorrt ``processMetadata``) sets
  ``[ONNX Layer: <node name> | ...]`` per layer, and fused layers join their entries with the ASCII
  separators 0x1E / 0x1F (TREx ``fix_unicode``). Metadata names are used first, then the layer name.
* Reformat/copy layers (``Reformatting CopyNode for ...``, DLA ``... to nvm`` / ``... from nvm`` /
  ``... copy finish``) are glue, not ONNX nodes: counted, never mapped.
"""
from __future__ import annotations

import json
import re

_META = re.compile(r"\[ONNX Layer: (.*?)(?: \| [^\]]*)?\]")
_FOREIGN = re.compile(r"^\{ForeignNode\[(.*)\]\}$", re.S)
_SPLIT = re.compile(r"\s\+\s|PWN\(|\)|,\s")
_GLUE_SUFFIXES = (" to nvm", " from nvm", " copy finish", " finish")


def layer_device(layer: dict, dla_core: int | None) -> str:
    """``"DLA"`` or ``"GPU"`` for one raw inspector layer object (rules in the module docstring)."""
    kinds = " ".join(str(layer.get(k, "")) for k in ("LayerType", "ParameterType", "TacticName", "Origin")).lower()
    if "dla" in kinds:
        return "DLA"
    if dla_core is not None and _FOREIGN.match(str(layer.get("Name", ""))) and "myelin" not in kinds:
        return "DLA"
    return "GPU"


def _is_glue(name: str, kind: str) -> bool:
    return (kind.lower() in ("reformat", "signal", "wait") or name.startswith("Reformatting CopyNode")
            or name.endswith(_GLUE_SUFFIXES))


def inspector_layers(info: dict | str, dla_core: int | None) -> list[dict]:
    """Normalize ``get_engine_information(LayerInformationFormat.JSON)`` (the parsed object or its text) to
    ``[{"name", "type", "device": "DLA"|"GPU", "onnx": [node names from Metadata], "glue": bool}]`` in
    engine order. Raises ValueError when ``info`` is not the inspector's ``{"Layers": [...]}`` object."""
    if isinstance(info, str):
        info = json.loads(info)
    if not isinstance(info, dict) or not isinstance(info.get("Layers"), list):
        raise ValueError('not engine-inspector JSON (expected an object with a "Layers" list)')
    out = []
    for raw in info["Layers"]:
        lay = raw if isinstance(raw, dict) else {"Name": str(raw)}      # LAYER_NAMES_ONLY: bare names
        name, kind = str(lay.get("Name", "")), str(lay.get("LayerType", ""))
        meta = str(lay.get("Metadata", ""))
        onnx = [n.strip() for part in re.split("[\x1e\x1f]", meta) for n in _META.findall(part)]
        out.append({"name": name, "type": kind, "device": layer_device(lay, dla_core), "onnx": onnx,
                    "glue": _is_glue(name, kind)})
    return out


def layer_nodes(layer: dict, index: dict[str, int], order: list[str]) -> list[int]:
    """Indices of the ONNX nodes (``index``: name -> position in graph order ``order``) one normalized
    inspector layer runs: its Metadata names, else a ForeignNode range, else the parts of a fused name."""
    if layer.get("glue"):
        return []
    found = [index[n] for n in layer.get("onnx", []) if n in index]
    name = layer["name"]
    m = _FOREIGN.match(name)
    if m:
        ends = m.group(1).split("...")
        if len(ends) == 2 and ends[0] in index and ends[1] in index:
            lo, hi = sorted((index[ends[0]], index[ends[1]]))
            found += range(lo, hi + 1)
        elif len(ends) == 1 and ends[0] in index:
            found.append(index[ends[0]])
    elif not found:
        found = [index[p.strip()] for p in _SPLIT.split(name) if p.strip() in index]
    return sorted(set(found))
