"""The cpu board's compiler stage: every op runs on the host CPU; the report says which kernel runs it
(XNNPACK, LiteRT's builtin kernel or an edgehft native kernel)."""
from __future__ import annotations

from edgehft.compiler.stage import CompilerStage, StageInput, StageOutput
from edgehft.ir import TFLiteModel
from edgehft.ir.tflite_model import source_layer
from edgehft.report import OpPlacement, Report, segments_of


def native_reason(op_name: str, plan: str) -> str:
    """Why ``op_name`` runs on an edgehft native kernel under ``plan`` (native or native-bf16), for the report."""
    if op_name == "UNIDIRECTIONAL_SEQUENCE_LSTM":
        return ("edgehft native: input projection on the bf16 conv kernel, recurrence on the fp32 LSTM kernel "
                "(native-bf16 plan)" if plan == "native-bf16" else "edgehft's native fp32 LSTM kernel (native plan)")
    if op_name == "LEAKY_RELU":
        return "fused into the CONV_2D before it on edgehft's native bf16 conv kernel (native-bf16 plan)"
    if op_name in ("RESHAPE", "STRIDED_SLICE"):
        return "a view of its input, no copy (native-bf16 plan)"
    if op_name == "CONV_2D":
        return ("edgehft's native bf16 conv kernel: AMX tiles, AVX512_BF16 or SIMD, the best the box runs "
                "(native-bf16 plan)")
    return "edgehft's native fp32 kernel, cpu_ops.cpp (native-bf16 plan)"


def op_report(ir: TFLiteModel, kernels: dict[int, str], layers: list, plan: str = "") -> list[OpPlacement]:
    """One cpu placement per op of ``ir``'s main graph: ``kernels`` maps op index -> the kernel that ran it
    (XNNPACK, native; builtin when absent), ``layers`` the source model's (name, class) pairs (LSTM names
    go to the fused LSTM ops in order)."""
    lstm_layers = [n for n, c in layers if c == "LSTM"]
    ops = []
    for op in ir.main.ops:
        out = ir.main.tensors[op.outputs[0]] if op.outputs else None
        layer = source_layer(out.name) if out else None
        if op.name == "UNIDIRECTIONAL_SEQUENCE_LSTM" and lstm_layers:
            layer = lstm_layers.pop(0)
        kernel = kernels.get(op.index, "builtin")
        reason = ("delegated to XNNPACK" if kernel == "XNNPACK" else native_reason(op.name, plan)
                  if kernel == "native" else "XNNPACK does not take it")
        ops.append(OpPlacement(index=op.index, op=op.name, version=op.version, layer=layer, placement="cpu",
                               reason_code=f"CPU_{kernel.upper()}", reason=reason, kernel=kernel,
                               dtype=out.dtype if out else None))
    return ops


class CpuStage(CompilerStage):
    """Host-CPU boards: plans are timed here (``--quant auto``); the report is confirmed by the interpreter
    that made the golden vectors."""

    plans_on_host = True

    def build(self, ctx: StageInput) -> StageOutput:
        """The per-op kernel report of ``ctx.ir`` (no extra files)."""
        ops = op_report(ctx.ir, ctx.gold.kernels, ctx.info["layers"], ctx.quant)
        counts: dict[str, int] = {}
        for op in ops:
            counts[op.kernel] = counts.get(op.kernel, 0) + 1
        name = ctx.board.name
        report = Report(board=name, verdict="confirmed", verdict_source=ctx.gold.path, ops=ops, counts=counts,
                        segments=segments_of(ops), boundary_copies=0, drift=ctx.drift, golden=ctx.golden,
                        notes=[f"the {name} board runs every op on the host CPU; 'kernel' says whether XNNPACK, "
                               "LiteRT's builtin kernel or an edgehft native kernel runs it"])
        return StageOutput(report)


STAGE = CpuStage()
