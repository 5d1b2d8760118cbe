"""The cpu board's ONNX Runtime plans at compile (issue 15 item 5): ``ort-float`` and ``ort-int8``.

Where ``onnxruntime``, ``onnx`` and ``tf2onnx`` import on the compile host, ``--quant auto`` asks the converter
worker for the float32 ONNX export of the lowered model (tf2onnx, batch 1: an LSTM stays one ONNX ``LSTM``
node; :mod:`edgehft.compiler.onnx_export`), optionally: an export that fails leaves these two plans out with
the reason. From it:

- ``ort-float``: the export as it is, run by ONNX Runtime (CPU provider, ``ORT_ENABLE_ALL``, one thread);
- ``ort-int8``: ONNX Runtime's own static quantization of it (``onnxruntime.quantization.quantize_static``,
  Q/DQ format, int8 activations calibrated min/max on the same calibration windows as the TFLite int8 plan,
  per-channel int8 weights with ``reduce_range``), run by the same engine, which fuses the Q/DQ graph into its
  int8 kernels. ``reduce_range`` keeps the weights in 7 bits: ONNX Runtime's x86 int8 kernels add uint8 x int8
  products pairwise in int16 without VNNI (AVX2, ``vpmaddubsw``), and with 8-bit weights those sums saturate,
  so the same model gave other outputs on an AVX2 box than on a VNNI one (measured under ``qemu-x86_64 -cpu
  Haswell``: max |diff| 0.076 / 0.023 / 0.094 on the MLP / LSTM_A / DeepLOB, drift 2.5 / 1.4 / 3.2 %); with 7-bit
  weights 255 x 63 x 2 fits int16 and the outputs were the same to the bit on both, the drift under 1 %.

Each is a plan like the others (:mod:`edgehft.compiler.plans`): golden vectors and drift against Keras on
the cpu runtime (which runs it on ONNX Runtime, :mod:`edgehft.runtime.ort`), timed interleaved with the
other candidates, shipped when it passes the gate, chosen only when it is the fastest. Golden tolerance:
float outputs ``allclose`` with twice the distance from ONNX Runtime's reference path (graph optimizations off)
and at least 1e-5, as the float TFLite plans; for ``ort-int8`` at least one step of the output's int8 grid
too (:func:`output_step`): another CPU's int8 kernels may round one requantization the other way. A box whose
ONNX Runtime differs by more leaves the plan out at deploy.
"""
from __future__ import annotations

import importlib.util
import json
import logging
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np

from edgehft.errors import BoardUnavailableError
from edgehft.runtime.ort import ORT_PLANS

DESCRIPTIONS = {
    "ort-float": ("model.onnx is the float32 ONNX export of the model (tf2onnx); ONNX Runtime runs it on its CPU "
                  "execution provider with its default graph optimizations (ORT_ENABLE_ALL), one thread"),
    "ort-int8": ("model.onnx is ONNX Runtime's static int8 quantization of the ONNX export (Q/DQ, int8 "
                 "activations calibrated on the calibration windows, per-channel 7-bit weights: reduce_range); "
                 "ONNX Runtime runs it on its CPU execution provider, fusing the Q/DQ graph into its int8 kernels "
                 "(ORT_ENABLE_ALL), one thread"),
}
NEEDS = ("onnxruntime", "onnx", "tf2onnx")
_PASS_THROUGH = ("Cast", "Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze")


def unavailable() -> str | None:
    """Why the ONNX Runtime plans cannot be made on this host (a package that is not installed), or None."""
    gone = [p for p in NEEDS if importlib.util.find_spec(p) is None]
    return f"{', '.join(gone)} not installed on this host (pip install 'edgehft[compile]')" if gone else None


def worker_request(quant: str) -> dict:
    """What the converter worker must add for ``quant``: the float ONNX export, optional (a failure leaves the
    plans out) for ``auto`` where :func:`unavailable` is None, required for an ONNX Runtime plan asked for by
    name; nothing otherwise.

    Raises:
        BoardUnavailableError: an ONNX Runtime plan asked for by name where its packages are missing (exit 7).
    """
    if quant in ORT_PLANS:
        why = unavailable()
        if why:
            raise BoardUnavailableError(f"--quant {quant} needs ONNX Runtime and tf2onnx here: {why}",
                                        hint="pip install 'edgehft[compile]', or choose another --quant")
        return {"onnx": True}
    if quant == "auto" and unavailable() is None:
        return {"onnx": True, "onnx_optional": True}
    return {}


def make_qdq(float_onnx: Path, cal: np.ndarray, out: Path) -> dict:
    """Write ``out``: ONNX Runtime's static int8 quantization of ``float_onnx`` (Q/DQ format, int8
    activations and per-channel int8 weights with ``reduce_range``, min/max calibration on the float32 windows
    ``cal`` (N, *input_shape[1:]), one window per call). Returns the settings, for the report.

    Raises:
        ConverterError: onnxruntime.quantization refused the model.
    """
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    from edgehft.errors import ConverterError
    name = onnx.load(str(float_onnx), load_external_data=False).graph.input[0].name
    windows = np.ascontiguousarray(cal, dtype=np.float32)

    class Windows(CalibrationDataReader):
        def __init__(self):
            self.n = 0

        def get_next(self):
            if self.n >= len(windows):
                return None
            self.n += 1
            return {name: windows[self.n - 1:self.n]}

    settings = {"tool": "onnxruntime.quantization.quantize_static", "quant_format": "QDQ",
                "activations": "QInt8", "weights": "QInt8", "per_channel": True, "reduce_range": True,
                "calibrate_method": "MinMax", "calibration_windows": int(len(windows))}
    quiet = _Advice()                      # its advice to pre-process changes nothing here (measured: same kernels)
    logging.getLogger().addFilter(quiet)
    try:
        quantize_static(str(float_onnx), str(out), Windows(), quant_format=QuantFormat.QDQ, per_channel=True,
                        reduce_range=True, activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
    except Exception as exc:  # noqa: BLE001 - the quantizer's failure leaves the plan out, with its reason
        raise ConverterError(f"onnxruntime.quantization could not quantize the ONNX export: {type(exc).__name__}: "
                             + " ".join(str(exc).split())[:400]) from None
    finally:
        logging.getLogger().removeFilter(quiet)
    return settings


class _Advice(logging.Filter):
    """Drops onnxruntime.quantization's advice to pre-process the model (logged on the root logger)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "pre-processing" not in str(record.msg)


def io_specs(info: dict, held: np.ndarray, float_outs: list) -> tuple[list, list]:
    """The manifest's float32 input and output specs of an ONNX Runtime plan: the names the TFLite plans use
    (the worker's ``input_names``/``output_names``), batch 1, the shapes of the held-out windows ``held`` and
    of the Keras outputs ``float_outs``; ``index`` is the position in the session's inputs/outputs."""
    from edgehft.bundle import TensorSpec
    out_names = info["output_names"]
    ins = [TensorSpec(name=info["input_names"][0], index=0, shape=[1, *held.shape[1:]], dtype="float32")]
    outs = [TensorSpec(name=out_names[k] if k < len(out_names) else f"output_{k}", index=k,
                       shape=[1, *np.asarray(y).shape[1:]], dtype="float32") for k, y in enumerate(float_outs)]
    return ins, outs


def softmax_flags(onnx_path: Path) -> list[bool]:
    """Per graph output of the ONNX model: whether a Softmax makes it (the drift check's argmax agreement)."""
    from edgehft.compiler.onnx_check import softmax_outputs
    return softmax_outputs(onnx_path)


def output_step(onnx_path: Path) -> float:
    """The largest quantization step of the int8 grids the graph outputs of the Q/DQ model ``onnx_path`` are
    dequantized from (the scale of the DequantizeLinear that makes each, through Reshape/Cast/Identity...);
    0.0 where an output does not come from one."""
    import onnx
    from onnx import numpy_helper
    g = onnx.load(str(onnx_path), load_external_data=False).graph
    producer = {o: n for n in g.node for o in n.output}
    inits = {t.name: t for t in g.initializer}
    steps = []
    for out in g.output:
        n = producer.get(out.name)
        while n is not None and n.op_type in _PASS_THROUGH:
            n = producer.get(n.input[0])
        if n is not None and n.op_type == "DequantizeLinear" and n.input[1] in inits:
            steps.append(float(np.max(numpy_helper.to_array(inits[n.input[1]]))))
    return max(steps, default=0.0)


def kernels_ran(onnx_path: Path, window: np.ndarray) -> dict[str, int]:
    """Op type -> how many kernels of that type ONNX Runtime ran for one call on ``window`` (float32, the
    input's shape with batch 1) in the plan's own session (ORT_ENABLE_ALL: its fused kernels), from its
    profile (written to a temporary directory and removed)."""
    import onnxruntime as ort

    from edgehft.runtime.ort import NO_EXTERNAL_DATA
    with tempfile.TemporaryDirectory(prefix="edgehft-ort-profile-") as tmp:
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = 1, 1
        so.log_severity_level = 3
        so.add_session_config_entry("session.model_external_initializers_file_folder_path", NO_EXTERNAL_DATA)
        so.enable_profiling, so.profile_file_prefix = True, str(Path(tmp) / "ort")
        sess = ort.InferenceSession(Path(onnx_path).read_bytes(), so, providers=["CPUExecutionProvider"])
        sess.run(None, {sess.get_inputs()[0].name: np.ascontiguousarray(window, np.float32)})
        events = json.loads(Path(sess.end_profiling()).read_text())
    ran = Counter(e["args"]["op_name"] for e in events
                  if e.get("cat") == "Node" and str(e.get("name", "")).endswith("_kernel_time"))
    return dict(sorted(ran.items()))


def op_rows(onnx_path: Path, plan: str) -> list:
    """One cpu :class:`~edgehft.report.OpPlacement` per node of the ONNX model's main graph (kernel
    ``onnxruntime``); ONNX Runtime fuses some of them into one kernel when the session opens."""
    import onnx

    from edgehft.ir.tflite_model import source_layer
    from edgehft.report import OpPlacement
    g = onnx.load(str(onnx_path), load_external_data=False).graph
    reason = (f"ONNX Runtime's CPU kernel ({plan} plan; its graph optimizations may fuse the node with its "
              "neighbours into one kernel)")
    return [OpPlacement(index=k, op=n.op_type, layer=source_layer(n.name) or source_layer(n.output[0] if n.output
                                                                                          else ""),
                        placement="cpu", reason_code="CPU_ONNXRUNTIME", reason=reason, kernel="onnxruntime")
            for k, n in enumerate(g.node)]


def build(ctx, evaluated: dict):
    """The cpu board's report for an ONNX Runtime plan at the bundle's top level (what
    :meth:`edgehft.compiler.stage_cpu.CpuStage.build` gives a TFLite plan): the ONNX graph's nodes, the
    kernels ONNX Runtime ran, the quantization settings. Returns a :class:`~edgehft.compiler.stage.StageOutput`."""
    from edgehft.compiler.stage import StageOutput
    from edgehft.report import Report, segments_of
    ops = op_rows(evaluated["model_file"], ctx.quant)
    notes = [f"the {ctx.board.name} board runs this plan on ONNX Runtime: {DESCRIPTIONS[ctx.quant]}",
             "ONNX Runtime ran these kernels for one call here: " + ", ".join(
                 f"{op} x{n}" for op, n in evaluated.get("ort_kernels", {}).items())]
    if evaluated.get("qdq"):
        notes.append("int8 quantization: " + json.dumps(evaluated["qdq"]))
    report = Report(board=ctx.board.name, verdict="confirmed", verdict_source=ctx.gold.path, ops=ops,
                    counts={"onnxruntime": len(ops)}, segments=segments_of(ops), boundary_copies=0, drift=ctx.drift,
                    golden=ctx.golden, notes=notes)
    from edgehft.runtime.ort import load_onnxruntime
    return StageOutput(report, toolchain={"onnxruntime": load_onnxruntime()[1], "onnx": _version("onnx"),
                                          "tf2onnx": _version("tf2onnx")})


def _version(pkg: str) -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(pkg)
    except PackageNotFoundError:
        return "?"
