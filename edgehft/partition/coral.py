"""The coral backend's partitioner: the Edge TPU compiler's placement of a .tflite, predicted by edgehft's
rules (:mod:`edgehft.partition.coral_predict`)."""
from __future__ import annotations

from pathlib import Path

from edgehft.partition.contract import Partitioner
from edgehft.report import Report


class CoralPartitioner(Partitioner):
    """Predicts from the int8 ``.tflite``; ``report MODEL.tflite`` without ``--board`` predicts for coral-usb."""

    suffixes = (".tflite",)
    default_boards = {".tflite": "coral-usb"}
    label = "Coral"
    table = "vendor"
    vendor = "coral-edgetpu"

    def predict(self, model: Path, board, **board_options) -> Report:
        """The predicted Edge TPU placement of ``model`` (a full-integer .tflite) under the board's ``[edgetpu]``
        flags, overridden by ``board_options["edgetpu"]`` (``-m/-a/-i``).

        Raises:
            InputError: not a valid .tflite, an ``-i`` tensor not in the model, or ``-m`` newer than the board's
                Edge TPU runtime (exit 3).
        """
        from edgehft.ir import TFLiteModel
        from edgehft.partition.coral_options import edgetpu_options
        from edgehft.partition.coral_report import edgetpu_report
        opts = edgetpu_options(board, board_options.get("edgetpu"))
        return edgetpu_report(TFLiteModel.from_file(Path(model)), board.name, opts,
                              link=getattr(board, "edgetpu", None))


PARTITIONER = CoralPartitioner()
