"""The compiler stage contract: what ``compile_model`` asks a board's backend, and the one result type
every backend returns. A backend names its stage object in :class:`edgehft.backends.Backend` (``compiler``);
the pipeline calls only these methods and never names a board kind.

The pipeline's order: :meth:`CompilerStage.validate` (before anything runs) → the converter worker, asked for
the model plus :meth:`CompilerStage.worker_request` → (when :attr:`CompilerStage.golden_on_cpu`) golden
vectors and drift on the cpu runtime → :meth:`CompilerStage.build` → feature pipeline, bundle write.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable



@dataclass
class StageInput:
    """What the pipeline hands :meth:`CompilerStage.build`.

    Always: ``board`` (:class:`edgehft.boards.Board`), ``opts`` (``CompileOptions``), ``quant`` (the plan
    chosen: int8, dynamic, ...), ``work`` (scratch directory; the worker's files are in ``work / "worker"``),
    ``info`` (the worker's record: names, layers, versions), ``source`` and ``quantization`` (the manifest's
    :class:`~edgehft.bundle.SourceModel` / :class:`~edgehft.bundle.Quantization`), ``cal``/``held`` (float32
    calibration and held-out windows, or None), ``float_outs`` (the float model's outputs on ``held``, or
    None), ``say`` (progress). With ``golden_on_cpu`` also: ``model_file`` (the int8 TFLite IR), ``ir``
    (:class:`~edgehft.ir.TFLiteModel`), ``gold`` (:class:`~edgehft.compiler.golden.GoldenRun`), ``golden``
    (the report's golden record) and ``drift`` (:class:`~edgehft.report.Drift` or None).
    """

    board: Any
    opts: Any
    quant: str
    work: Path
    info: dict
    source: Any
    quantization: Any
    cal: Any = None
    held: Any = None
    float_outs: Any = None
    say: Callable[[str], None] = lambda s: None
    model_file: Path | None = None
    ir: Any = None
    gold: Any = None
    golden: dict | None = None
    drift: Any = None


@dataclass
class StageOutput:
    """What every backend's :meth:`CompilerStage.build` returns.

    ``report`` (:class:`edgehft.report.Report`; the pipeline sets its ``drift`` and ``golden`` when it made
    them), ``files`` (bundle path -> bytes or a file to copy), ``artifacts``/``accelerator``/``toolchain``
    (merged into the manifest's), ``warnings``; and, from a backend that makes its own golden vectors
    (``golden_on_cpu`` False), the whole ``manifest`` (:class:`edgehft.bundle.Manifest`).
    """

    report: Any
    files: dict = field(default_factory=dict)
    artifacts: dict = field(default_factory=dict)
    accelerator: dict = field(default_factory=dict)
    toolchain: dict = field(default_factory=dict)
    warnings: list = field(default_factory=list)
    manifest: Any = None


class CompilerStage:
    """A backend's part of ``compile_model``. Subclass it and override what differs.

    Attributes:
        plans_on_host: the board runs on this host's CPU, so ``--quant auto`` (timing plans here) applies.
        golden_on_cpu: the pipeline makes golden vectors and drift on the cpu runtime before :meth:`build`
            (False: :meth:`build` makes them and returns the manifest).
        golden_may_be_missing: a model no LiteRT kernel path runs still compiles (its bundle says why it has
            no golden vectors) instead of being refused.
    """

    plans_on_host = False
    golden_on_cpu = True
    golden_may_be_missing = False

    def validate(self, board, model: Path, opts) -> None:
        """Refuse what does not apply to ``board`` before anything runs.

        Raises:
            InputError: board options its backend's :class:`~edgehft.board_options.BoardOptions` does not
                declare (another board kind's: the message names it and its options).
        """
        from edgehft import backends
        backends.refuse_foreign_options(board, opts.board_options)

    def worker_request(self, board, quant: str) -> dict:
        """Extra fields for the converter worker's request (merged over the pipeline's); none by default."""
        return {}

    def build(self, ctx: StageInput) -> StageOutput:
        """The board's artifacts and report from ``ctx``."""
        raise NotImplementedError(f"{type(self).__name__}.build")
