"""The coral backend's board options: edgetpu_compiler's ``-m``, ``-a``, ``-i`` (compile and report) and
``--edgetpu-model`` (compile), over the board file's ``[edgetpu]`` table (:func:`edgetpu_options`)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edgehft.board_options import BoardOptions, Option
from edgehft.errors import InputError
from edgehft.partition.coral_predict import EdgeTPUOptions


@dataclass
class EdgeTPUFlags:
    """Overrides of the board's ``[edgetpu]`` table (None: the board's value)."""

    min_runtime_version: int | None = None
    allow_multiple_subgraphs: bool | None = None
    intermediate_tensors: tuple[str, ...] | None = None


def edgetpu_options(board, flags: EdgeTPUFlags | None = None) -> EdgeTPUOptions:
    """The compiler flags for ``board`` (a :class:`~edgehft.boards.Board`): its ``[edgetpu]`` table,
    overridden by ``flags``.

    Raises:
        InputError: ``-m`` newer than the board's Edge TPU runtime (exit 3).
    """
    cfg = dict(getattr(board, "edgetpu", None) or {})
    flags = flags or EdgeTPUFlags()
    m = flags.min_runtime_version if flags.min_runtime_version is not None else int(cfg.get("min_runtime_version", 14))
    a = flags.allow_multiple_subgraphs if flags.allow_multiple_subgraphs is not None else \
        bool(cfg.get("allow_multiple_subgraphs", False))
    i = flags.intermediate_tensors if flags.intermediate_tensors is not None else \
        tuple(cfg.get("intermediate_tensors", ()))
    runtime = int(board.runtime.get("edgetpu_runtime", m))
    if m > runtime:
        raise InputError(f"-m {m} is newer than the Edge TPU runtime {runtime} of board {board.name}",
                         hint=f"pass -m {runtime} or lower, or update the board file if the boxes run newer")
    return EdgeTPUOptions(min_runtime_version=m, allow_multiple_subgraphs=a, intermediate_tensors=tuple(i))


class CoralOptions(BoardOptions):
    """``-m/-a/-i`` become ``board_options["edgetpu"]`` (an :class:`EdgeTPUFlags`), ``--edgetpu-model``
    ``board_options["edgetpu_model"]`` (a Path)."""

    def collect(self, values: dict) -> dict:
        """See :meth:`BoardOptions.collect`; ``-i t1,t2`` is split at the commas."""
        cut = values.get("cut")
        flags = EdgeTPUFlags(values.get("min_runtime"), values.get("multi") or None,
                             tuple(c for c in cut.split(",") if c) if cut else None)
        out = {}
        if any(v is not None for v in vars(flags).values()):
            out["edgetpu"] = flags
        if values.get("edgetpu_model"):
            out["edgetpu_model"] = Path(values["edgetpu_model"])
        return out


OPTIONS = CoralOptions(owner="Coral", keys=("edgetpu", "edgetpu_model"), options=(
    Option(("--min-runtime", "-m"), "min_runtime", kind="int", minimum=10,
           help="Edge TPU boards: edgetpu_compiler -m (default: the board's runtime version)."),
    Option(("--allow-multiple-subgraphs", "-a"), "multi", kind="flag",
           help="Edge TPU boards: edgetpu_compiler -a (more subgraphs, more host<->TPU copies)."),
    Option(("--intermediate-tensors", "-i"), "cut",
           help="Edge TPU boards: edgetpu_compiler -i t1,t2 (end the Edge TPU part at these tensors)."),
    Option(("--edgetpu-model",), "edgetpu_model", kind="file", commands=("compile",),
           help="Edge TPU boards: MODEL's *_edgetpu.tflite, compiled on another machine; checked against "
                "MODEL and put in the bundle (verdict confirmed)."),
))
