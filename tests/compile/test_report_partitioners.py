"""`edgehft report MODEL` through the backends' partitioners (edgehft/partition/contract.py): the default board
per model suffix is the partitioners' data, each built-in predicts with one signature, and a PYNQ board now
predicts a .tflite (before, only Coral boards did) without a traceback on a corrupt model."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import ROOT, run_maker
from hostile import bit_flips
from edgehft import backends
from edgehft.boards import load_board
from edgehft.cli import main

MUTANTS, SEED = 200, 29


@pytest.fixture(scope="module")
def fuzz_models(tmp_path_factory) -> Path:
    return run_maker(ROOT / "tests" / "make_fuzz_models.py", tmp_path_factory.mktemp("fuzz-models"), timeout=300)


def _report(*args) -> tuple:
    r = CliRunner().invoke(main, ["report", *map(str, args)])
    return r.exit_code, r.exception, " ".join(r.output.split())


def test_every_builtin_partitioner_predicts_with_one_signature(fuzz_models):
    """The same call, predict(model, board, **board_options), for coral and pynq; pynq's is pynq_report's."""
    from edgehft.ir import TFLiteModel
    from edgehft.partition.pynq import pynq_report
    model = fuzz_models / "mlp_int8.tflite"
    coral = backends.partitioner("coral").predict(model, load_board("coral-usb"), edgetpu=None)
    assert coral.board == "coral-usb" and coral.accelerator["vendor"] == "coral-edgetpu"
    assert coral.accelerator["flags"] == ["-m", "14"] and len(coral.ops) == len(TFLiteModel.from_file(model).main.ops)
    kv260 = load_board("kv260")
    pynq = backends.partitioner("pynq").predict(model, kv260, edgetpu=None)
    assert pynq.model_dump() == pynq_report(TFLiteModel.from_file(model), kv260).model_dump()
    fabric = [o.op for o in pynq.ops if o.placement == "accelerator"]
    assert fabric == ["FULLY_CONNECTED", "FULLY_CONNECTED"] and pynq.counts["accelerator"] == 2


def test_report_defaults_and_refusals(fuzz_models):
    model = fuzz_models / "mlp_int8.tflite"
    rc, exc, text = _report(model, "--json")
    assert rc == 0, text
    # without --board: coral-usb, as before (the coral partitioner's default for .tflite)
    assert json.loads(CliRunner().invoke(main, ["report", str(model), "--json"]).output)["report"]["board"] == "coral-usb"
    rc, exc, text = _report(model, "--board", "kv260")
    assert rc == 0, text
    assert "kv260: " in text and "placement predicted (edgehft cost model of overlay" in text
    assert "2 of " in text and "ops run in the fabric" in text
    rc, exc, text = _report(model, "--board", "jetson-agx-orin")
    assert rc == 3 and "a .tflite partition prediction is available for Coral boards and PYNQ boards, not " \
                       "jetson-agx-orin" in text and "pass --board coral-usb (or " in text


def _mutants(data: bytes) -> list:
    return bit_flips(data, MUTANTS, SEED)


def test_pynq_prediction_of_corrupt_models_is_exit_0_or_3(fuzz_models, tmp_path):
    """200 seeded single-bit flips of the int8 MLP through `report X.tflite --board kv260` (in process: no
    interpreter runs): each is predicted (0) or refused as bad input (3), never an uncaught exception."""
    codes: dict = {}
    problems = []
    for k, (bit, data) in enumerate(_mutants((fuzz_models / "mlp_int8.tflite").read_bytes())):
        p = tmp_path / f"m{k}.tflite"
        p.write_bytes(data)
        rc, exc, text = _report(p, "--board", "kv260")
        codes[rc] = codes.get(rc, 0) + 1
        if rc not in (0, 3) or (exc is not None and not isinstance(exc, SystemExit)):
            problems.append(f"bit {bit}: exit {rc}, {type(exc).__name__}: {exc}")
    assert not problems, "\n".join(problems[:10])
    assert codes.get(3, 0) > MUTANTS // 4 and codes.get(0, 0) > 0


def test_an_onnx_model_predicts_for_jetson_agx_orin_by_default(tmp_path):
    """The jetson partitioner's data: .onnx defaults to jetson-agx-orin and its reports use the engine table."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["r"], name="relu0"),
                           helper.make_node("Softmax", ["r"], ["y"], name="sm")], "g", [x], [y])
    p = tmp_path / "tiny.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(p))
    r = CliRunner().invoke(main, ["report", str(p), "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)["report"]
    assert rep["board"] == "jetson-agx-orin" and [o["op"] for o in rep["ops"]] == ["Relu", "Softmax"]
    assert rep["accelerator"]["vendor"] == "nvidia-tensorrt"
    rc, exc, text = _report(p)
    assert rc == 0 and "ONNX node" in text and "engine layer / why" in text     # the partitioner's "engine" table
    rc, exc, text = _report(p, "--board", "kv260")
    assert rc == 3 and "an ONNX placement prediction is available for Jetson boards, not kv260" in text
