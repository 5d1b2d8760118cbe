"""The Coral boards' compiler stage: the int8 IR partitioned (and compiled, where edgetpu_compiler is
installed) for the Edge TPU by :func:`edgehft.compiler.coral.coral_stage`."""
from __future__ import annotations

from edgehft.compiler import coral
from edgehft.compiler.stage import CompilerStage, StageInput, StageOutput


class CoralStage(CompilerStage):
    """Edge TPU boards: they take the Edge TPU flags, the worker makes model I/O of the board's dtype, and
    a model LiteRT cannot run still gets its partition (the bundle says why it has no golden vectors)."""

    golden_may_be_missing = True

    def worker_request(self, board, quant: str) -> dict:
        """The model's I/O dtype for the board's Edge TPU runtime (``io_dtype``)."""
        return {"io_dtype": coral.io_dtype(board)}

    def build(self, ctx: StageInput) -> StageOutput:
        """Partition/compile ``ctx.model_file``; the golden record's notes and warnings join the report."""
        given = ctx.opts.board_options
        st = coral.coral_stage(ctx.model_file, ctx.work, ctx.board, given.get("edgetpu"), timeout_s=ctx.opts.timeout_s,
                               compiled_model=given.get("edgetpu_model"), say=ctx.say)
        notes, warnings = coral.golden_notes(ctx.golden)
        st.report.notes += notes
        st.warnings = warnings + st.warnings
        return st


STAGE = CoralStage()
