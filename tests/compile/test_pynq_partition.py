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
