"""PYNQ boards: which ops the overlay's kernels take, and the cycle / µs / copy estimates."""
import pytest

from edgehft.boards import load_board
from edgehft.ir import TFLiteModel
from edgehft.partition.pynq import partition, pynq_report

BOARDS = ["pynq-z2", "kv260", "zcu104", "ultra96"]


@pytest.fixture(scope="module")
def deeplob_ir(deeplob_bundle):
    return TFLiteModel.from_file(deeplob_bundle / "model.tflite")


@pytest.mark.parametrize("name", BOARDS)
def test_deeplob_lstm_and_dense_go_to_the_fabric(deeplob_ir, name):
    board = load_board(name)
    part = partition(deeplob_ir, board)
    assert {k: c.kernel for k, c in part.calls.items()} == {31: "lstm_int8", 33: "dense_int8"}
    assert [s.placement for s in part.segments] == ["cpu", "accelerator", "cpu", "accelerator", "cpu"]
    assert part.calls[31].macs == 100 * 4 * 64 * (192 + 64) and part.calls[33].macs == 64 * 3
    # four copies: reshape->LSTM (19,200 B), LSTM->slice (6,400 B), slice->FC (64 B), FC->softmax (3 B)
    assert sorted(c["bytes"] for c in part.copies) == [3, 64, 6400, 19200]


def test_deeplob_estimates_on_pynq_z2(deeplob_ir):
    rep = pynq_report(deeplob_ir, load_board("pynq-z2"))
    acc = rep.accelerator
    # LSTM: 100 steps x (ceil(4*64*256/128) + 64 + 40) cycles + streaming 19,200 B in, 6,400 B out
    lstm = acc["fpga_segments"][0]
    assert (lstm["ops"], lstm["cycles"]) == ([31], 100 * (512 + 64 + 40) + 64 + 2400 + 800)
    assert lstm["us"] == pytest.approx(lstm["cycles"] / 100.0)
    assert acc["mac_bound_us"] == pytest.approx(6_553_792 / (220 * 100.0), abs=0.01)
    assert rep.verdict == "predicted" and "not measured" in rep.verdict_source
    assert rep.counts == {"accelerator": 2, "cpu": 33}
    assert any("32,486,400 MACs" in line for line in rep.summary)


def test_limits_and_weight_memory(deeplob_ir):
    board = load_board("pynq-z2")
    small = board.model_copy(update={"overlay": {**board.overlay, "lstm_max_hidden": 32}})
    part = partition(deeplob_ir, small)
    assert 31 not in part.calls and part.refusals[31][0] == "TOO_LARGE"
    assert "hidden 64 exceeds the kernel's 32" in part.refusals[31][1]
    tight = board.model_copy(update={"overlay": {**board.overlay, "weight_bytes": 60_000}})
    part = partition(deeplob_ir, tight)
    assert part.refusals[31][0] == "WEIGHTS_DONT_FIT" and 33 in part.calls   # the FC's 204 B still fit


def test_arm_segments_get_an_estimate_from_the_board_file(deeplob_ir):
    """Issue 19: the ops the ARM cores keep get µs from the board file's [arm_cost] table, said to be an estimate:
    DeepLOB's first (4,1) conv on the PYNQ-Z2's A9 is 100 x 20 x 32 x 32 x 4 = 8,192,000 int8 MACs at 650 MHz x 2
    a cycle = 6,301.5 µs, plus 8 µs an op and its 64,000 output bytes at 400 B/µs (160 µs)."""
    from edgehft.partition.pynq import arm_op_us
    board = load_board("pynq-z2")
    rep = pynq_report(deeplob_ir, board)
    conv = next(op for op in deeplob_ir.main.ops if op.index == 2)
    assert conv.name == "CONV_2D" and arm_op_us(deeplob_ir, conv, board.arm_cost) == pytest.approx(6469.54, abs=0.01)
    cpu = [op for op in deeplob_ir.main.ops if op.index not in (31, 33)]
    assert rep.accelerator["arm_us_estimate"] == pytest.approx(sum(arm_op_us(deeplob_ir, op, board.arm_cost)
                                                                   for op in cpu), abs=0.1)
    assert "~6,469.5 µs on the ARM cores (estimate)" in next(o for o in rep.ops if o.index == 2).reason
    assert any("the ARM cores, not the fabric, set the latency" in line for line in rep.summary)
    assert any("estimates from the board file's [arm_cost] table" in n for n in rep.notes)
    # a faster core (the KV260's A53 at 1.333 GHz, 4 int8 MACs a cycle) estimates less; no table: not estimated
    assert pynq_report(deeplob_ir, load_board("kv260")).accelerator["arm_us_estimate"] < \
        rep.accelerator["arm_us_estimate"] / 3
    bare = pynq_report(deeplob_ir, board.model_copy(update={"arm_cost": None}))
    assert "arm_us_estimate" not in bare.accelerator and any("not estimated" in n for n in bare.notes)
