"""The Jetson boards' compiler stage: ONNX (float, fp16 or explicit Q/DQ) from the worker, golden vectors
and the predicted TensorRT placement by :func:`edgehft.compiler.jetson.jetson_stage`; the engine itself is
built on the board."""
from __future__ import annotations

import platform

from edgehft import __version__
from edgehft.compiler.stage import CompilerStage, StageInput, StageOutput
from edgehft.errors import InputError


class JetsonStage(CompilerStage):
    """TensorRT boards: a Keras model only (exported to ONNX), and golden vectors of their own (not the
    cpu runtime's): :meth:`build` returns the manifest."""

    golden_on_cpu = False

    def validate(self, board, model, opts) -> None:
        """Raises: InputError: a ``.tflite`` model (Jetson takes the Keras model), or another board kind's options."""
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
        ctx.say("golden vectors and TensorRT placement from the ONNX model")
        st = jetson_stage(ctx)
        st.manifest.toolchain = {**ctx.info["versions"], "edgehft": __version__, "python": platform.python_version(),
                                 "tensorrt_predicted_for": ctx.board.tensorrt["version"]}
        st.manifest.accelerator = {"onnx": ctx.info["onnx"], "engine": "built on the board (not portable)"}
        return st

STAGE = JetsonStage()
