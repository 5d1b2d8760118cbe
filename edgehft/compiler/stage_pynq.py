"""The PYNQ boards' compiler stage: the int8 IR cut into CPU segments and packed FPGA weights by
:func:`edgehft.compiler.pynq.pynq_stage`."""
from __future__ import annotations

from edgehft.compiler.stage import CompilerStage, StageInput, StageOutput


class PynqStage(CompilerStage):
    """FPGA boards (PYNQ overlays)."""

    def build(self, ctx: StageInput) -> StageOutput:
        """Partition ``ctx.model_file`` for the board's overlay (the golden run says which ops XNNPACK took)."""
        from edgehft.compiler.pynq import pynq_stage
        ctx.say("partition for the FPGA overlay")
        return pynq_stage(ctx.model_file, ctx.board, ctx.gold.kernels, say=ctx.say)


STAGE = PynqStage()
