"""Partition an int8 model for a PYNQ board: FULLY_CONNECTED and UNIDIRECTIONAL_SEQUENCE_LSTM go to the
edgehft overlay's kernels when they fit, everything else runs on the board's ARM cores through LiteRT.

The latency estimate follows the kernels' loop structure (bitstreams/kernels/*.cpp), one int8 MAC per
DSP lane per fabric cycle:

- ``dense_int8``: per output row, ``ceil(n_in / lanes)`` pipelined cycles (II=1), plus the MAC-tree and
  requantize pipeline depth; activations stream in and out over one AXI master port.
- ``lstm_int8``: per time step, the four gates' ``4 * n_h * (n_in + n_h)`` MACs over ``lanes`` lanes,
  then the cell/hidden update of ``n_h`` elements pipelined at II=1; inputs and outputs stream over
  the AXI port.

A boundary copy (ARM <-> fabric) costs the board's ``call_overhead_us`` (AXI-Lite writes, cache
flush/invalidate, polling ap_done) plus its bytes over ``axi_bytes_per_s``. Figures are predictions
from this model, not measurements: the report says so.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from edgehft.ir.tflite_model import OpInfo, TFLiteModel, source_layer
from edgehft.partition.contract import Partitioner
from edgehft.report import OpPlacement, Report, Segment

PIPELINE_DEPTH = 24              # cycles: MAC adder tree + Q31 requantize + saturate (dense)
LSTM_STEP_DEPTH = 40             # cycles: gate requantize + sigmoid/tanh tables + cell update per step
AXI_BYTES_PER_CYCLE = 8          # one 64-bit AXI master port at the fabric clock
AXI_LATENCY = 32                 # cycles before a burst's first beat
_ACTS = {0: "NONE", 1: "RELU", 2: "RELU_N1_TO_1", 3: "RELU6"}
# LSTM inputs that must be absent (-1) for the 8x8_16 kernel: peepholes 9-11, projection 16-17,
# layer norm 20-23.
_LSTM_ABSENT = {9: "peephole", 10: "peephole", 11: "peephole", 16: "projection", 17: "projection",
                20: "layer norm", 21: "layer norm", 22: "layer norm", 23: "layer norm"}


@dataclass
class KernelCall:
    op: int
    kernel: str                  # dense_int8 | lstm_int8
    macs: int
    cycles: int
    weight_bytes: int
    in_bytes: int
    out_bytes: int
    slot: int = 0                # on-chip weight slot of this kernel (0, 1, ... per kernel)


@dataclass
class PynqPartition:
    board: str
    overlay: str
    clock_mhz: float
    calls: dict[int, KernelCall]
    refusals: dict[int, tuple[str, str, str | None]]     # op -> (code, reason, fix) for FC/LSTM left on CPU
    segments: list[Segment] = field(default_factory=list)
    copies: list[dict] = field(default_factory=list)


def _size(t) -> int:
    return int(np.prod(t.shape)) * (np.dtype(t.dtype).itemsize if t.dtype in ("int8", "int16", "int32") else 4)


def _check_fc(op: OpInfo, m: TFLiteModel, ov: dict) -> tuple[KernelCall | None, tuple | None]:
    g = m.main
    x, w = g.tensors[op.inputs[0]], g.tensors[op.inputs[1]]
    y = g.tensors[op.outputs[0]]
    if (x.dtype, w.dtype, y.dtype) != ("int8", "int8", "int8"):
        return None, ("NOT_INT8", f"dtypes {x.dtype} x {w.dtype} -> {y.dtype}; the kernel is int8 x int8 -> int8",
                      "compile with --quant int8")
    if not w.is_constant:
        return None, ("WEIGHTS_NOT_CONSTANT", "weights are a runtime tensor", None)
    act = op.options.get("FusedActivationFunction", 0)
    if act not in _ACTS:
        return None, ("ACTIVATION", f"fused activation {act} has no kernel clamp", "apply it as its own layer")
    if op.options.get("WeightsFormat", 0) != 0:
        return None, ("WEIGHTS_FORMAT", "shuffled weights format", "convert without weight shuffling")
    n_out, n_in = w.shape
    rows = int(np.prod(x.shape)) // n_in
    if n_in > ov["dense_max_in"] or n_out > ov["dense_max_out"]:
        return None, ("TOO_LARGE", f"{n_in} -> {n_out} exceeds the kernel's {ov['dense_max_in']} -> "
                                   f"{ov['dense_max_out']}", f"keep Dense layers within {ov['dense_max_in']} inputs and "
                                                             f"{ov['dense_max_out']} units to run them in the fabric")
    lanes = ov["dense_lanes"]
    cycles = rows * (n_out * math.ceil(n_in / lanes) + PIPELINE_DEPTH) + _stream(rows * n_in, rows * n_out)
    return KernelCall(op.index, "dense_int8", rows * n_in * n_out, cycles, n_out * n_in + 4 * n_out,
                      _size(x), _size(y)), None


def _check_lstm(op: OpInfo, m: TFLiteModel, ov: dict) -> tuple[KernelCall | None, tuple | None]:
    g = m.main
    x, y = g.tensors[op.inputs[0]], g.tensors[op.outputs[0]]
    if x.dtype != "int8" or y.dtype != "int8":
        return None, ("NOT_INT8", f"LSTM on {x.dtype} -> {y.dtype}; the kernel is the int8 (8x8_16) LSTM",
                      "compile with --quant int8")
    for k, what in _LSTM_ABSENT.items():
        if k < len(op.inputs) and op.inputs[k] >= 0:
            return None, ("LSTM_FEATURE", f"the LSTM uses {what} (input {k})", f"build the layer without {what}")
    if op.inputs[1] < 0:
        return None, ("LSTM_FEATURE", "CIFG (coupled input-forget gate) LSTM", "use a standard LSTM")
    if op.options.get("TimeMajor", False) or x.shape[0] != 1:
        return None, ("LSTM_LAYOUT", f"input {x.shape}: the kernel takes batch-major (1, T, n_in)", None)
    _, steps, n_in = x.shape
    n_h = g.tensors[op.inputs[5]].shape[0]
    limits = (("input", n_in, ov["lstm_max_in"]), ("hidden", n_h, ov["lstm_max_hidden"]),
              ("steps", steps, ov["lstm_max_steps"]))
    for what, got, most in limits:
        if got > most:
            return None, ("TOO_LARGE", f"{what} {got} exceeds the kernel's {most}",
                          f"use at most {most} ({what}) to run it in the fabric; as is it runs on the ARM cores")
    lanes = ov["lstm_lanes"]
    macs = steps * 4 * n_h * (n_in + n_h)
    per_step = math.ceil(4 * n_h * (n_in + n_h) / lanes) + n_h + LSTM_STEP_DEPTH
    cycles = steps * per_step + _stream(steps * n_in, _size(y))
    weights = 4 * n_h * (n_in + n_h) + 4 * 4 * n_h
    return KernelCall(op.index, "lstm_int8", macs, cycles, weights, _size(x), _size(y)), None


def _macs(model: TFLiteModel, op: OpInfo) -> int:
    """Multiply-accumulates of a CONV_2D / DEPTHWISE_CONV_2D / FULLY_CONNECTED / int8 LSTM op (0 for others)."""
    g = model.main
    if op.name == "CONV_2D":
        w = g.tensors[op.inputs[1]].shape                       # (out_c, kh, kw, in_c)
        return int(np.prod(g.tensors[op.outputs[0]].shape)) * w[1] * w[2] * w[3]
    if op.name == "DEPTHWISE_CONV_2D":
        w = g.tensors[op.inputs[1]].shape                       # (1, kh, kw, out_c)
        return int(np.prod(g.tensors[op.outputs[0]].shape)) * w[1] * w[2]
    if op.name == "FULLY_CONNECTED":
        w = g.tensors[op.inputs[1]].shape
        return int(np.prod(g.tensors[op.outputs[0]].shape)) * w[1]
    if op.name == "UNIDIRECTIONAL_SEQUENCE_LSTM":
        x = g.tensors[op.inputs[0]].shape
        n_h = g.tensors[op.inputs[5]].shape[0]
        return int(np.prod(x[:-1])) * 4 * n_h * (x[-1] + n_h)
    return 0


def arm_op_us(model: TFLiteModel, op: OpInfo, cost: dict) -> float:
    """An ESTIMATE of one op's time on the board's ARM cores (LiteRT, one thread), µs, from the board's
    ``[arm_cost]`` table: MACs / (``clock_mhz`` x ``int8_macs_per_cycle``, or ``float_macs_per_cycle`` for a float
    output) + ``op_overhead_us`` + output bytes / ``bytes_per_us``. A model of the cores, not a measurement."""
    g = model.main
    out = g.tensors[op.outputs[0]] if op.outputs else None
    rate = float(cost["clock_mhz"]) * float(cost["float_macs_per_cycle" if out is not None and
                                                 out.dtype == "float32" else "int8_macs_per_cycle"])
    return _macs(model, op) / rate + float(cost["op_overhead_us"]) + \
        (_size(out) if out is not None else 0) / float(cost["bytes_per_us"])


def _stream(bytes_in: int, bytes_out: int) -> int:
    return 2 * AXI_LATENCY + math.ceil(bytes_in / AXI_BYTES_PER_CYCLE) + math.ceil(bytes_out / AXI_BYTES_PER_CYCLE)


def partition(model: TFLiteModel, board) -> PynqPartition:
    """Which ops of ``model`` the overlay of ``board`` runs (``board``: a pynq Board with ``[fpga]`` and
    ``[overlay]`` tables), with the kernel calls' cycle estimates, segments and boundary copies."""
    ov, fpga = board.overlay, board.fpga
    calls: dict[int, KernelCall] = {}
    refusals: dict[int, tuple] = {}
    budget = int(ov["weight_bytes"])
    used: dict[str, int] = {}
    for op in model.main.ops:
        check = {"FULLY_CONNECTED": _check_fc, "UNIDIRECTIONAL_SEQUENCE_LSTM": _check_lstm}.get(op.name)
        if check is None:
            continue
        call, refusal = check(op, model, ov)
        if call is not None and call.weight_bytes > budget:
            call, refusal = None, ("WEIGHTS_DONT_FIT", f"{call.weight_bytes:,} B of weights; {budget:,} B of the "
                                   f"overlay's on-chip weight memory left", "shrink the layer or use a larger board")
        if call is not None and used.get(call.kernel, 0) >= int(ov.get("slots", 4)):
            call, refusal = None, ("NO_SLOT", f"the overlay's {call.kernel} holds {ov.get('slots', 4)} layers and "
                                   "they are taken by earlier ones", "fewer layers of this kind, or a board whose "
                                   "overlay has more slots; this one runs on the ARM cores")
        if call is None:
            refusals[op.index] = refusal
        else:
            call.slot = used.get(call.kernel, 0)
            used[call.kernel] = call.slot + 1
            calls[op.index] = call
            budget -= call.weight_bytes
    part = PynqPartition(board.name, ov["name"], float(fpga["fabric_clock_mhz"]), calls, refusals)
    _segments(part, model, board)
    return part


def _segments(part: PynqPartition, model: TFLiteModel, board) -> None:
    g = model.main
    place = ["accelerator" if op.index in part.calls else "cpu" for op in g.ops]
    segs: list[Segment] = []
    for op, p in zip(g.ops, place):
        if segs and segs[-1].placement == p:
            segs[-1].ops.append(op.index)
        else:
            segs.append(Segment(index=len(segs), placement=p, ops=[op.index]))
    part.segments = segs
    # The runtime hands every kernel call its input through a host buffer (copy + flush) and reads its
    # output back (invalidate + copy), even between two consecutive FPGA ops: one copy in and one copy
    # out per call, each with the board's call overhead (AXI-Lite writes, cache maintenance, polling).
    over, bw = float(board.fpga["call_overhead_us"]), float(board.fpga["axi_bytes_per_s"])
    copies = []
    for k, call in sorted(part.calls.items()):
        op = g.ops[k]
        for direction, t in (("to_fpga", g.tensors[op.inputs[0]]), ("to_cpu", g.tensors[op.outputs[0]])):
            copies.append({"op": k, "kernel": call.kernel, "direction": direction, "tensor": t.name,
                           "bytes": _size(t), "us": round(over + _size(t) / bw * 1e6, 2)})
    part.copies = copies


def pynq_report(model: TFLiteModel, board) -> Report:
    """The shared report for ``board``: per op where it runs and why, FPGA segments' cycles and µs,
    boundary copies, and the MAC-bound limit of the board."""
    part = partition(model, board)
    mhz = part.clock_mhz
    ops = []
    for op in model.main.ops:
        out = model.main.tensors[op.outputs[0]] if op.outputs else None
        layer = source_layer(out.name) if out else None
        call = part.calls.get(op.index)
        if call:
            us = call.cycles / mhz
            ops.append(OpPlacement(index=op.index, op=op.name, version=op.version, layer=layer,
                                   placement="accelerator", reason_code="FPGA_KERNEL",
                                   reason=f"{call.kernel}: {call.macs:,} MACs, ~{call.cycles:,} cycles = "
                                          f"{us:,.1f} µs at {mhz:g} MHz", kernel=f"fpga:{call.kernel}",
                                   dtype=out.dtype if out else None, status=f"FPGA {call.kernel}"))
        else:
            code, reason, fix = part.refusals.get(op.index, ("CPU_OP", "no overlay kernel for this op; "
                                                             "LiteRT on the ARM cores", None))
            ops.append(OpPlacement(index=op.index, op=op.name, version=op.version, layer=layer, placement="cpu",
                                   reason_code=code, reason=reason, fix=fix, kernel="cpu (LiteRT)",
                                   dtype=out.dtype if out else None, status="CPU (ARM, LiteRT)"))
    fpga_us = sum(c.cycles for c in part.calls.values()) / mhz
    copy_us = sum(c["us"] for c in part.copies)
    macs = sum(c.macs for c in part.calls.values())
    dsp = int(board.fpga["dsp"])
    bound_us = macs / (dsp * mhz) if macs else 0.0
    seg_info = []
    for s in part.segments:
        if s.placement == "accelerator":
            cyc = sum(part.calls[k].cycles for k in s.ops)
            seg_info.append({"segment": s.index, "ops": s.ops, "kernels": [part.calls[k].kernel for k in s.ops],
                             "macs": sum(part.calls[k].macs for k in s.ops), "cycles": cyc,
                             "us": round(cyc / mhz, 2)})
    rep = Report(board=board.name, verdict="predicted",
                 verdict_source=f"edgehft cost model of overlay {part.overlay} (kernel loop structure at "
                                f"{mhz:g} MHz; not measured)",
                 ops=ops, counts={"accelerator": len(part.calls), "cpu": len(ops) - len(part.calls)},
                 segments=part.segments, boundary_copies=len(part.copies))
    rep.accelerator = {"vendor": "edgehft-pynq-overlay", "overlay": part.overlay, "part": board.fpga["part"],
                       "clock_mhz": mhz, "fpga_segments": seg_info, "copies": part.copies,
                       "fpga_us": round(fpga_us, 2), "copy_us": round(copy_us, 2), "macs": macs,
                       "mac_bound_us": round(bound_us, 2), "dsp": dsp,
                       "lanes": {"dense": board.overlay["dense_lanes"], "lstm": board.overlay["lstm_lanes"]}}
    lines = [f"{len(part.calls)} of {len(ops)} ops run in the fabric ({', '.join(sorted({c.kernel for c in part.calls.values()})) or 'none'}); "
             f"{len(ops) - len(part.calls)} on the ARM cores through LiteRT."]
    for si in seg_info:
        lines.append(f"fabric ops {', '.join(f'#{k}' for k in si['ops'])}: "
                     f"{si['macs']:,} MACs, ~{si['cycles']:,} cycles = {si['us']:,.1f} µs at {mhz:g} MHz.")
    if part.copies:
        each = "; ".join(f"#{c['op']} {'in' if c['direction'] == 'to_fpga' else 'out'} {c['bytes']:,} B {c['us']:g} µs"
                         for c in part.copies)
        lines.append(f"{len(part.copies)} ARM<->fabric copies (one in, one out per kernel call), "
                     f"{sum(c['bytes'] for c in part.copies):,} B, ~{copy_us:,.1f} µs: {each} "
                     f"({board.fpga['call_overhead_us']} µs each for flush/invalidate and ap_ctrl, plus bytes over AXI).")
    if macs:
        lines.append(f"MAC-bound limit of the fabric work: {macs:,} MACs / ({dsp} DSPs x {mhz:g} MHz) = "
                     f"{bound_us:,.2f} µs; the overlay uses {board.overlay['lstm_lanes'] + board.overlay['dense_lanes']}"
                     f" lanes, so the estimate is {fpga_us / bound_us:.1f}x that limit.")
        used_w = sum(c.weight_bytes for c in part.calls.values())
        lines.append(f"on-chip weight memory: {used_w:,} of {int(board.overlay['weight_bytes']):,} B; slots used: "
                     + ", ".join(f"{k} {sum(c.kernel == k for c in part.calls.values())}/{board.overlay.get('slots', 4)}"
                                 for k in sorted({c.kernel for c in part.calls.values()})) + ".")
    lines += _arm_lines(model, board, part, macs, fpga_us + copy_us, rep)
    for k, (code, reason, fix) in part.refusals.items():
        lines.append(f"#{k} {model.main.ops[k].name} stays on the CPU: {reason}" + (f" (fix: {fix})" if fix else ""))
    rep.summary = lines
    return rep


def _arm_lines(model: TFLiteModel, board, part: PynqPartition, fabric_macs: int, fabric_us: float, rep) -> list:
    """The report's sentences on the ops the ARM cores keep: their MACs and, from the board's ``[arm_cost]``
    table (:func:`arm_op_us`), their estimated µs (``rep.accelerator["arm_us_estimate"]``, per op in each
    placement's reason); "not estimated" for a board file without the table."""
    cpu_ops = [op for op in model.main.ops if op.index not in part.calls]
    cpu_macs = sum(_macs(model, op) for op in cpu_ops)
    cost = getattr(board, "arm_cost", None)
    if not cost:
        rep.notes.append("ARM-segment time is not estimated (no [arm_cost] table in the board file): it is the "
                         "LiteRT time of those ops on the board's cores (measure with `edgehft bench` on the board)")
        share = cpu_macs / max(fabric_macs + cpu_macs, 1)
        return [f"the ARM cores keep {cpu_macs:,} MACs of CONV/FC/LSTM work ({share:.1%} of the model's); their "
                "time is not estimated."] if cpu_macs else []
    per = {op.index: arm_op_us(model, op, cost) for op in cpu_ops}
    for o in rep.ops:
        if o.index in per:
            o.reason = f"{o.reason}; ~{per[o.index]:,.1f} µs on the ARM cores (estimate)"
    arm_us = sum(per.values())
    rep.accelerator["arm_us_estimate"] = round(arm_us, 1)
    rep.notes.append(f"ARM-segment times are estimates from the board file's [arm_cost] table ({cost['clock_mhz']:g} "
                     f"MHz, {cost['int8_macs_per_cycle']:g} int8 MACs a cycle, {cost['op_overhead_us']:g} µs an op), "
                     "not measurements: measure with `edgehft bench` on the board")
    if not cpu_ops:
        return []
    big = max(cpu_ops, key=lambda op: per[op.index])
    return [f"the ARM cores keep {len(cpu_ops)} ops ({cpu_macs:,} MACs): ~{arm_us:,.0f} µs estimated, the largest "
            f"#{big.index} {big.name} ~{per[big.index]:,.0f} µs; the fabric and its copies ~{fabric_us:,.0f} µs"
            + ("; the ARM cores, not the fabric, set the latency." if arm_us > fabric_us else ".")]


class PynqPartitioner(Partitioner):
    """The pynq backend's partitioner: the overlay's kernel calls for a ``.tflite`` (``report MODEL --board
    kv260``), by :func:`pynq_report`'s cost model."""

    suffixes = (".tflite",)
    label = "PYNQ"
    table = "vendor"
    vendor = "edgehft-pynq-overlay"

    def predict(self, model, board, **board_options) -> Report:
        """The predicted placement of ``model`` (an int8 .tflite file) on ``board``'s overlay; ``board_options``
        are ignored.

        Raises:
            InputError: not a valid .tflite (exit 3).
        """
        from pathlib import Path
        return pynq_report(TFLiteModel.from_file(Path(model)), board)


PARTITIONER = PynqPartitioner()
