"""``edgehft report BUNDLE`` for Jetson bundles: the engine inspector's confirmed per-node placement next to the
prediction (layer 3 of the Jetson backend's report; no GPU, no TensorRT here).

The inspector outputs below are HAND-WRITTEN in the documented ``get_engine_information(LayerInformationFormat.JSON)``
format (``{"Layers": [{"Name", "LayerType", "Inputs", "Outputs", "Metadata"}], "Bindings": [...]}``, see
``edgehft.partition.jetson_confirmed``) to describe a plausible engine for the real DeepLOB and MLP ONNX that
compile produces; they were NOT produced by a real engine. ``test_build_engine_cli_writes_the_record`` stands in
for the builder (a monkeypatched ``build_engine``; ``tensorrt`` itself is never imported or faked) to exercise
the command's record plumbing."""
import json
import shutil

import pytest
from click.testing import CliRunner

from edgehft.boards import load_board
from edgehft.bundle import load_bundle
from edgehft.cli import main
from edgehft.compiler.pipeline import CompileOptions, compile_model
from edgehft.partition.jetson_confirmed import (apply_record, inspector_layers, layer_device, layer_nodes,
                                                  record_for)
from edgehft.report import Report
from edgehft.toolchains import tensorrt as T

IDENTITY = {"l4t": "# R36 (release), REVISION: 4.0", "module": "NVIDIA Jetson AGX Orin Developer Kit"}
DLA_REGION = "{ForeignNode[deeplob/conv2d/BiasAdd...deeplob/concatenate/concat]}"


def _t(name, dims, fmt="Row major linear FP16 format"):
    return {"Name": name, "Dimensions": dims, "Format/Datatype": fmt}


def deeplob_engine(softmax_on_gpu=False, fold_reshape=False):
    """A DLA-core-0 + GPU-fallback engine for DeepLOB's fp16 ONNX, TensorRT 10.3 style (hand-written): the
    conv stack as one DLA ForeignNode with its reformat copy, LSTM as loop layers named only by Metadata, the
    LSTM tail as a Myelin region on the GPU, Softmax as its own DLA region (or, ``softmax_on_gpu``, a GPU
    SoftMax layer); ``fold_reshape`` leaves the first Reshape out (folded by the builder)."""
    layers = [
        {"Name": "lob_to_fp16", "LayerType": "Cast", "Inputs": [_t("lob", [1, 100, 40, 1], "Row major linear FP32")],
         "Outputs": [_t("lob_to_fp16:0", [1, 100, 40, 1])], "Metadata": "[ONNX Layer: lob_to_fp16]"},
        {"Name": "deeplob/conv2d/BiasAdd__38", "LayerType": "NoOp", "Inputs": [], "Outputs": []},
        {"Name": f"Reformatting CopyNode for Input Tensor 0 to {DLA_REGION}", "LayerType": "Reformat",
         "Origin": "REFORMAT", "Inputs": [], "Outputs": []},
        {"Name": DLA_REGION, "LayerType": "ForeignNode", "Inputs": [], "Outputs": [], "TacticValue": "0x0"},
        {"Name": "Transpose__82 + deeplob/lstm/PartitionedCall/transpose", "LayerType": "Shuffle",
         "Inputs": [], "Outputs": [], "Metadata": "[ONNX Layer: Transpose__82]\x1f[ONNX Layer: deeplob/lstm/PartitionedCall/transpose]"},
        {"Name": "(Unnamed Layer* 61) [Recurrence]", "LayerType": "Recurrence", "Metadata": "[ONNX Layer: LSTM__28]"},
        {"Name": "(Unnamed Layer* 64) [Matrix Multiply]", "LayerType": "CaskGemmMatrixMultiply",
         "Metadata": "[ONNX Layer: LSTM__28]"},
        {"Name": "{ForeignNode[Squeeze__32...deeplob/signal/MatMul_Gemm__37]}", "LayerType": "Myelin"},
        {"Name": "deeplob/signal/Softmax", "LayerType": "SoftMax", "Metadata": "[ONNX Layer: deeplob/signal/Softmax]"}
        if softmax_on_gpu else {"Name": "{ForeignNode[deeplob/signal/Softmax]}", "LayerType": "ForeignNode"},
        {"Name": "signal_to_fp32", "LayerType": "Cast", "Metadata": "[ONNX Layer: signal_to_fp32]"},
    ]
    if fold_reshape:
        layers = [lay for lay in layers if lay["Name"] != "deeplob/conv2d/BiasAdd__38"]
    return {"Layers": layers, "Bindings": ["lob", "signal"]}


def _record(bundle, info, dla_core=0, version="10.3.0"):
    m = load_bundle(bundle).manifest
    key = T.cache_key(version, IDENTITY, dla_core, m.quantization.mode, m.files[m.model_file])
    return record_for(key=key, board=m.board, bundle=str(bundle), version=version, identity=IDENTITY,
                      dla_core=dla_core, precision=m.quantization.mode, model_sha256=m.files[m.model_file],
                      layers=inspector_layers(info, dla_core), engine=str(T.cache_dir() / f"{key}.engine"))


def _cache(record):
    d = T.cache_dir()
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{record['key']}.json"
    path.write_text(json.dumps(record))
    return path


def _report(bundle, *extra):
    res = CliRunner().invoke(main, ["report", str(bundle), "--json", *extra])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)["report"]


def _snapshot(bundle):
    return {str(p.relative_to(bundle)): p.read_bytes() for p in sorted(bundle.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def deeplob_agx(deeplob_jetson):
    """conftest's session bundle of DeepLOB for jetson-agx-orin."""
    return deeplob_jetson


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEHFT_CACHE", str(tmp_path / "cache"))
    return T.cache_dir()


def test_inspector_json_normalization():
    info = {"Layers": ["conv_a + relu_a", "{ForeignNode[a...b]}"], "Bindings": ["x", "y"]}   # LAYER_NAMES_ONLY
    assert [(lay["name"], lay["device"]) for lay in inspector_layers(json.dumps(info), 0)] == \
        [("conv_a + relu_a", "GPU"), ("{ForeignNode[a...b]}", "DLA")]
    assert inspector_layers(info, None)[1]["device"] == "GPU"                  # no DLA core: a Myelin region
    assert layer_device({"Name": "{ForeignNode[a...b]}", "LayerType": "Myelin"}, 0) == "GPU"
    assert layer_device({"Name": "x", "LayerType": "DLA"}, None) == "DLA"
    meta = inspector_layers({"Layers": [{"Name": "f", "LayerType": "CaskConvolution",
                                         "Metadata": "[ONNX Layer: c1 | blk (Fn)]\x1e[ONNX Layer: r1]"}]}, None)
    assert meta[0]["onnx"] == ["c1", "r1"]
    order = ["c0", "c1", "r1", "add", "out"]
    index = {n: k for k, n in enumerate(order)}
    assert layer_nodes({"name": "PWN(PWN(r1), add)", "onnx": []}, index, order) == [2, 3]
    assert layer_nodes({"name": "{ForeignNode[c1...add]}", "onnx": []}, index, order) == [1, 2, 3]
    assert layer_nodes({"name": "Reformatting CopyNode for Input Tensor 0 to c1", "onnx": [], "glue": True},
                       index, order) == []
    with pytest.raises(ValueError, match="Layers"):
        inspector_layers({"layers": []}, 0)


def test_predicted_fallback_without_record(deeplob_agx, cache):
    rep = _report(deeplob_agx)
    assert rep["verdict"] == "predicted" and rep["accelerator"]["engine"] is None
    assert {(o["verdict"], o["confirmed"]) for o in rep["ops"]} == {("predicted", None)}
    assert any("build-engine" in n for n in rep["notes"])
    text = " ".join(CliRunner().invoke(main, ["report", str(deeplob_agx)]).output.split())
    assert "placement predicted" in text and "ONNX node" in text


def test_confirmed_rows(deeplob_agx, cache):
    _cache(_record(deeplob_agx, deeplob_engine()))
    rep = _report(deeplob_agx)
    assert rep["verdict"] == "confirmed" and rep["verdict_source"] == "TensorRT 10.3.0 engine inspector"
    ops = rep["ops"]
    assert len(ops) == 41 and all(o["verdict"] == "confirmed" for o in ops)
    convs = [o for o in ops if o["op"] == "Conv"]
    assert len(convs) == 14 and {(o["kernel"], o["confirmed"], o["confirmed_by"]) for o in convs} == \
        {("DLA", "DLA", DLA_REGION)}
    lstm = next(o for o in ops if o["op"] == "LSTM")                 # found through the layer Metadata only
    assert (lstm["confirmed"], lstm["confirmed_by"]) == \
        ("GPU", "(Unnamed Layer* 61) [Recurrence] | (Unnamed Layer* 64) [Matrix Multiply]")
    gemm = next(o for o in ops if o["op"] == "Gemm")                 # a Myelin ForeignNode runs on the GPU
    assert gemm["confirmed"] == "GPU" and gemm["confirmed_by"].startswith("{ForeignNode[Squeeze__32")
    assert next(o for o in ops if o["op"] == "Softmax")["confirmed"] == "DLA"
    assert rep["disagreements"] == []
    eng = rep["accelerator"]["engine"]
    assert (eng["agreement"], eng["dla_core"], eng["glue_layers"], eng["unmapped_layers"]) == ("41/41", 0, 1, [])
    assert eng["layer_devices"] == {"GPU": 7, "DLA": 2} and eng["record"].startswith(str(cache))
    assert rep["counts"] == {"gpu": 10, "dla": 31} and rep["boundary_copies"] == 4


def test_disagreement_and_unnamed_nodes(deeplob_agx, cache):
    _cache(_record(deeplob_agx, deeplob_engine(softmax_on_gpu=True, fold_reshape=True)))
    rep = _report(deeplob_agx)
    assert rep["disagreements"] == [{"index": 39, "op": "Softmax", "name": "deeplob/signal/Softmax",
                                     "predicted": "DLA", "actual": "GPU", "layer": "deeplob/signal/Softmax"}]
    reshape = rep["ops"][1]                                        # folded: no engine layer names it
    assert (reshape["verdict"], reshape["confirmed"], reshape["kernel"]) == ("predicted", None, "GPU")
    eng = rep["accelerator"]["engine"]
    assert eng["unconfirmed_nodes"] == [1] and eng["agreement"] == "39/40"
    assert rep["boundary_copies"] == 2                              # Softmax on the GPU: two switches fewer
    text = " ".join(CliRunner().invoke(main, ["report", str(deeplob_agx)]).output.split())
    assert "disagreement: #39 Softmax: predicted DLA, TensorRT 10.3.0 engine inspector says GPU" in text
    assert "1 node(s) named by no engine layer" in text and "placement confirmed" in text


def test_newest_record_wins_and_bundle_still_verifies(deeplob_agx, cache, tmp_path):
    before = _snapshot(deeplob_agx)
    old = _record(deeplob_agx, deeplob_engine(), dla_core=1)
    old["built_utc"] = "2000-01-01T00:00:00+00:00"
    _cache(old)
    new = _record(deeplob_agx, deeplob_engine(softmax_on_gpu=True))
    _cache(new)
    rep = _report(deeplob_agx)
    eng = rep["accelerator"]["engine"]
    assert eng["key"] == new["key"] and [r["dla_core"] for r in eng["other_records"]] == [1]
    load_bundle(deeplob_agx, verify=True)                          # the bundle is never written
    assert _snapshot(deeplob_agx) == before
    # a record copied off the board, read with --engine-record (empty cache here)
    copied = tmp_path / "copied.json"
    copied.write_text(json.dumps(old))
    shutil.rmtree(cache)
    assert _report(deeplob_agx, "--engine-record", str(copied))["accelerator"]["engine"]["dla_core"] == 1
    other = dict(old, model_sha256="0" * 64)
    copied.write_text(json.dumps(other))
    res = CliRunner().invoke(main, ["report", str(deeplob_agx), "--engine-record", str(copied), "--json"])
    assert res.exit_code == 3 and "another model" in json.loads(res.output)["error"]


def test_build_engine_cli_writes_the_record(deeplob_agx, cache, monkeypatch):
    """The builder is replaced by a stand-in returning the hand-written inspector layers (no GPU here); the
    command's own code keys, caches and records them, and report reads that record."""
    before = _snapshot(deeplob_agx)
    monkeypatch.setattr(T, "build_engine", lambda *a, dla_core=None, **k:
                        (b"stand-in, not an engine", inspector_layers(deeplob_engine(), dla_core), "10.3.0"))
    monkeypatch.setattr(T, "board_identity", lambda: IDENTITY)
    res = CliRunner().invoke(main, ["build-engine", str(deeplob_agx), "--dla-core", "0", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["counts"] == {"DLA": 2, "GPU": 7} and out["record"].startswith(str(cache))
    rec = json.loads(open(out["record"]).read())
    assert rec["format"] == "edgehft-engine-placement" and rec["dla_core"] == 0 and rec["key"] in out["engine"]
    rep = _report(deeplob_agx)
    assert rep["verdict"] == "confirmed" and rep["accelerator"]["engine"]["key"] == rec["key"]
    assert _snapshot(deeplob_agx) == before and load_bundle(deeplob_agx).manifest.files


def test_mlp_on_xavier_names_only(mlp, tmp_path):
    """TensorRT 8.5 (Xavier NX) has no layer Metadata: nodes are found by layer name alone. Here the last Relu
    is fused into its MatMul on the GPU although it was predicted on the DLA."""
    out = tmp_path / "mlp.xavier"
    res = compile_model(mlp / "mlp.keras", [mlp / "x.npy"], out, CompileOptions(board="jetson-xavier-nx"))
    names = [o.layer for o in res.report.ops]
    assert names[1:10:2] == [f"mlp/dense_{k}/MatMul" for k in range(4)] + ["mlp/signal/MatMul"]
    layers = ["features_to_fp16"]
    for k in range(3):
        layers += [f"mlp/dense_{k}/MatMul", f"Reformatting CopyNode for Input Tensor 0 to {{ForeignNode[mlp/dense_{k}/Relu]}}",
                   f"{{ForeignNode[mlp/dense_{k}/Relu]}}", f"mlp/dense_{k}/Relu to nvm"]
    layers += ["mlp/dense_3/MatMul + mlp/dense_3/Relu", "mlp/signal/MatMul", "signal_to_fp32"]
    kind = {"R": "Reformat", "{": "ForeignNode"}
    info = {"Layers": [{"Name": n, "LayerType": "" if n.endswith(" to nvm") else kind.get(n[0], "CaskGemmMatrixMultiply")}
                       for n in layers]}
    version = load_board("jetson-xavier-nx").tensorrt["version"]
    rep = apply_record(Report(**load_bundle(out).report()), _record(out, info, version=version), "hand-written")
    assert [o.confirmed for o in rep.ops] == ["GPU", "GPU", "DLA", "GPU", "DLA", "GPU", "DLA", "GPU", "GPU", "GPU", "GPU"]
    assert [(d["index"], d["predicted"], d["actual"]) for d in rep.disagreements] == [(8, "DLA", "GPU")]
    assert rep.accelerator["engine"]["glue_layers"] == 6 and rep.verdict_source == f"TensorRT {version} engine inspector"
