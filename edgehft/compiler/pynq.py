"""The PYNQ stage of ``compile``: partition the int8 model for the overlay, cut the CPU segments into
their own .tflite models, pack each FPGA op's weights and integer parameters for its kernel, and
describe the whole chain in ``steps.json`` for the runtime.

Bit-exactness: the FPGA kernels implement the arithmetic of the interpreter path that computed the
golden vectors (the cpu runtime, LiteRT AUTO). The int8 LSTM uses gemmlowp double rounding on every
LiteRT path; a FULLY_CONNECTED requantizes as XNNPACK does (``fp32``) when XNNPACK ran it for the golden
vectors, else as LiteRT's builtin x86 kernel (``ruy-x86``). The choice is recorded per step.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from edgehft.compiler.stage import StageOutput
from edgehft.ir import TFLiteModel
from edgehft.partition.pynq import partition, pynq_report


def _tensor(g, index: int) -> dict:
    t = g.tensors[index]
    return {"name": t.name, "shape": list(t.shape), "dtype": t.dtype}


def pynq_stage(model_file: Path, board, kernels_by_op: dict[int, str], say=lambda s: None) -> StageOutput:
    """Build the PYNQ artifacts for ``model_file`` (the int8 IR) on ``board``.

    Args:
        kernels_by_op: which ops XNNPACK ran when the golden vectors were made (``delegated_ops``).
    Raises:
        UnsupportedOpError: an op the partition gave the FPGA that the kernels' parameter model refuses
            (it is then a bug in the partition's checks: reported, not hidden).
    """
    from edgehft.compiler.split import split
    from edgehft.kernels.fpga.blob import pack_fc, pack_lstm
    from edgehft.kernels.fpga.params import fully_connected_params, lstm_params
    ir = TFLiteModel.from_file(model_file)
    g = ir.main
    rep = pynq_report(ir, board)
    part = partition(ir, board)
    say("cut CPU segments and pack FPGA weights")
    cpu_segs = [s for s in part.segments if s.placement == "cpu"]
    models = {s.index: m for s, m in zip(cpu_segs, split(Path(model_file).read_bytes(), [s.ops for s in cpu_segs]))}
    files: dict[str, bytes] = {}
    steps = []
    for seg in part.segments:
        if seg.placement == "cpu":
            m = models[seg.index]
            name = f"segments/seg{seg.index}.tflite"
            files[name] = m.data
            names = {t.name: t.index for t in g.tensors}
            steps.append({"placement": "cpu", "segment": seg.index, "ops": seg.ops, "model": name,
                          "inputs": [_tensor(g, names[n]) for n in m.inputs],
                          "outputs": [_tensor(g, names[n]) for n in m.outputs]})
            continue
        for k in seg.ops:
            call, op = part.calls[k], g.ops[k]
            if call.kernel == "dense_int8":
                mode = "fp32" if kernels_by_op.get(k) == "XNNPACK" else "ruy-x86"
                fc = fully_connected_params(ir, op)
                rows = int(np.prod(g.tensors[op.inputs[0]].shape)) // fc.n_in
                blob = pack_fc(fc, mode, rows=rows)
            else:
                mode = "gemmlowp"
                blob = pack_lstm(lstm_params(ir, op), mode, steps=int(g.tensors[op.inputs[0]].shape[1]))
            w, p = f"fpga/op{k}.weights.bin", f"fpga/op{k}.params.bin"
            files[w] = np.ascontiguousarray(blob.weights, np.int8).tobytes()
            files[p] = np.ascontiguousarray(blob.params, np.int32).tobytes()
            steps.append({"placement": "fpga", "segment": seg.index, "op": k, "kernel": call.kernel,
                          "slot": call.slot, "requantize": mode, "weights": w, "params": p,
                          "dims": {key: int(v) for key, v in blob.dims.items()},
                          "weights_len": int(blob.weights.size), "params_len": int(blob.params.size),
                          "inputs": [_tensor(g, op.inputs[0])], "outputs": [_tensor(g, op.outputs[0])]})
    graph = {"inputs": [_tensor(g, i) for i in g.inputs], "outputs": [_tensor(g, i) for i in g.outputs],
             "steps": steps}
    files["steps.json"] = (json.dumps(graph, indent=1) + "\n").encode()
    acc = {"overlay": board.overlay["name"], "part": board.fpga["part"],
           "kernels": sorted({s["kernel"] for s in steps if s["placement"] == "fpga"}),
           "requantize": {str(s["op"]): s["requantize"] for s in steps if s["placement"] == "fpga"}}
    rep.notes.append("FPGA kernels reproduce the golden path's arithmetic: " + ", ".join(
        f"#{s['op']} {s['kernel']} requantizes as {s['requantize']}" for s in steps if s["placement"] == "fpga"))
    return StageOutput(rep, files, {"steps": "steps.json"}, acc)
