"""The jetson backend's partitioner: TensorRT's ONNX parser support and DLA/GPU placement of an .onnx model,
predicted by edgehft's tables (:mod:`edgehft.partition.jetson_predict`), and confirmed by the engine inspector's
placement records once ``build-engine`` ran (:mod:`edgehft.partition.jetson_confirmed`)."""
from __future__ import annotations

from pathlib import Path

from edgehft.partition.contract import Partitioner
from edgehft.report import Report


class JetsonPartitioner(Partitioner):
    """Predicts from the ``.onnx``; ``report MODEL.onnx`` without ``--board`` predicts for jetson-agx-orin."""

    suffixes = (".onnx",)
    default_boards = {".onnx": "jetson-agx-orin"}
    label = "Jetson"
    table = "engine"
    vendor = "nvidia-tensorrt"
    takes_engine_records = True

    def predict(self, model: Path, board, **board_options) -> Report:
        """The predicted TensorRT placement of every node of the ONNX file ``model`` as exported (precision
        "as exported"); ``board_options`` are ignored."""
        from edgehft.partition.jetson_predict import tensorrt_report
        return tensorrt_report(str(model), board, "as exported")

    def confirm(self, bundle, report: Report, records=()) -> Report:
        """The bundle's report with the newest engine placement record (``records``, else the engine cache's)
        laid over it; without one every op says ``verdict="predicted"``.

        Raises:
            InputError: a named record that is unreadable or for another model.
        """
        from edgehft.partition.jetson_confirmed import confirmed_report
        return confirmed_report(bundle, report, records)


PARTITIONER = JetsonPartitioner()
