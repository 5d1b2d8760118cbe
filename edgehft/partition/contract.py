"""The partitioner contract: what ``edgehft report`` asks a board's backend about a model or a bundle.

A backend names its partitioner object in :class:`edgehft.backends.Backend` (``partitioner``,
``"module:attribute"``); the CLI and the report tables call only this class's methods and read its data
attributes, and never name a board kind. The shape of ONNX Runtime's ``GetCapability``: given a model file and
a board, which ops run where, as the shared :class:`~edgehft.report.Report`.
"""
from __future__ import annotations

from pathlib import Path

from edgehft.errors import InputError
from edgehft.report import Report


class Partitioner:
    """A backend's placement prediction. Subclass it, set the data attributes and override :meth:`predict`.

    Attributes:
        suffixes: the model file suffixes it predicts for (``".tflite"``: the int8 TFLite IR, ``".onnx"``).
        default_boards: suffix -> the board ``edgehft report MODEL`` predicts for without ``--board`` (the first
            backend, in :func:`edgehft.backends.names` order, declaring a suffix gives the default).
        label: what its boards are called in messages ("Coral", "Jetson").
        table: how :func:`edgehft.report.print_report` lays its reports out (a key of
            :data:`edgehft.report.TABLES`; "": as :func:`edgehft.report.table_layout` infers from the report).
        vendor: the ``accelerator["vendor"]`` tag its reports carry ("" for none), so a report printed without
            its backend (``compile``'s) gets :attr:`table` too.
        takes_engine_records: :meth:`confirm` reads placement records that the board's own tool wrote
            (``report BUNDLE --engine-record``, ``build-engine``).
    """

    suffixes: tuple = ()
    default_boards: dict = {}
    label = ""
    table = ""
    vendor = ""
    takes_engine_records = False

    def predict(self, model: Path, board, **board_options) -> Report:
        """The predicted placement of every op of the model file ``model`` on ``board``
        (:class:`edgehft.boards.Board`); ``board_options`` are what the backends' own options
        (:mod:`edgehft.board_options`) made of the CLI's flags, each read by the backend it belongs to
        (Coral's ``edgetpu``: an :class:`~edgehft.partition.coral_options.EdgeTPUFlags`) and ignored by the others.

        Raises:
            InputError: the backend predicts nothing for this kind of model file (exit 3).
        """
        raise InputError(f"no {Path(model).suffix or 'model'} placement prediction for {board.name}")

    def confirm(self, bundle, report: Report, records=()) -> Report:
        """``report`` (the bundle's own) with what the board's tools confirmed since it was compiled laid over
        it; ``records``: files the user named (only when :attr:`takes_engine_records`). As is by default."""
        return report


NONE = Partitioner()
