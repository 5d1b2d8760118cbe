"""The Jetson boards' compiler stage: ONNX (float, fp16 or explicit Q/DQ) from the worker, golden vectors
and the predicted TensorRT placement by :func:`edgehft.compiler.jetson.jetson_stage`; the engine itself is
built on the board."""
from __future__ import annotations

import platform

from edgehft import __version__
from edgehft.bundle import Manifest
from edgehft.compiler.stage import CompilerStage, StageInput, StageOutput
from edgehft.errors import InputError


class JetsonStage(CompilerStage):
    """TensorRT boards: a Keras model only (exported to ONNX), and golden vectors of their own (not the
    cpu runtime's): :meth:`build` returns the manifest."""

    golden_on_cpu = False

    def validate(self, board, model, opts) -> None:
        """Raises: InputError: a ``.tflite`` model (Jetson takes the Keras model), or Edge TPU flags."""
        if model.suffix == ".tflite":
            raise InputError(f"{board.name} takes a Keras model (exported to ONNX), not a .tflite",
                             hint="pass the .keras / .h5 / SavedModel the .tflite came from")
        super().validate(board, model, opts)

    def worker_request(self, board, quant: str) -> dict:
        """The float ONNX (+ the int8 TFLite for ``int8``): :func:`edgehft.compiler.jetson.worker_request`."""
        from edgehft.compiler import jetson
        return jetson.worker_request(quant)

    def build(self, ctx: StageInput) -> StageOutput:
        """The bundle's ONNX model, golden vectors, report and manifest from the worker's ONNX export."""
        from edgehft.compiler.jetson import jetson_stage
        info, board = ctx.info, ctx.board
        ctx.say("golden vectors and TensorRT placement from the ONNX model")
        st = jetson_stage(ctx.work, info, ctx.quant, board, ctx.held, ctx.float_outs, ctx.opts.golden_count,
                          ctx.opts.drift_threshold, info["input_names"][0], info["output_names"])
        manifest = Manifest(board=board.name, backend=board.backend, model_file=st.model_file, source=ctx.source,
                            quantization=ctx.quantization, inputs=st.inputs, outputs=st.outputs, golden=st.golden)
        manifest.toolchain = {**info["versions"], "edgehft": __version__, "python": platform.python_version(),
                              "tensorrt_predicted_for": board.tensorrt["version"]}
        manifest.accelerator = {"onnx": info["onnx"], "engine": "built on the board (not portable)"}
        return StageOutput(st.report, files=dict(st.files), warnings=st.warnings, manifest=manifest)


STAGE = JetsonStage()
