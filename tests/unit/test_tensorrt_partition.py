"""TensorRT / DLA placement prediction per ONNX node (layer 2 of the Jetson backend; no GPU needed)."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgehft.boards import load_board
from edgehft.partition.jetson_predict import predict, tensorrt_report


def _w(name, shape):
    return numpy_helper.from_array(np.zeros(shape, np.float32), name)


@pytest.fixture(scope="module")
def graph_path(tmp_path_factory):
    """x(1,4,16,16) -> Conv 3x3 -> LeakyRelu -> MaxPool 3x3 -> Conv 33x1 -> MaxPool 9x9 -> Reshape -> Gemm
    -> Softmax;  s(20,1,8) -> LSTM;  and a NonMaxSuppression the parser does not take."""
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w1"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        n("LeakyRelu", ["c1"], ["a1"], alpha=0.01),
        n("MaxPool", ["a1"], ["p1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1]),
        n("Conv", ["p1", "w2"], ["c2"], kernel_shape=[33, 1], pads=[16, 0, 16, 0]),
        n("MaxPool", ["c2"], ["p2"], kernel_shape=[9, 9], strides=[9, 9]),
        n("Reshape", ["p2", "shape"], ["r"]),
        n("Gemm", ["r", "wg"], ["g"], transB=1),
        n("Softmax", ["g"], ["y"], axis=1),
        n("LSTM", ["s", "wx", "wh"], ["h", "hn"], hidden_size=8),
        n("NonMaxSuppression", ["boxes", "scores"], ["sel"]),
    ]
    inits = [_w("w1", (4, 4, 3, 3)), _w("w2", (4, 4, 33, 1)), _w("wg", (3, 4)), _w("wx", (1, 32, 8)),
             _w("wh", (1, 32, 8)), numpy_helper.from_array(np.array([1, 4], np.int64), "shape")]
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16, 16]),
           helper.make_tensor_value_info("s", TensorProto.FLOAT, [20, 1, 8]),
           helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, 4, 4]),
           helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 1, 4])]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3]),
            helper.make_tensor_value_info("h", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("sel", TensorProto.INT64, None)]
    model = helper.make_model(helper.make_graph(nodes, "g", ins, outs, inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path_factory.mktemp("onnx") / "rules.onnx"
    onnx.save(model, path)
    return path


def _places(path, board):
    return [(v.op, v.place, v.code) for v in predict(str(path), load_board(board))]


def test_dla_rules_on_orin(graph_path):
    assert _places(graph_path, "jetson-agx-orin") == [
        ("Conv", "dla", "DLA_OK"), ("LeakyRelu", "dla", "DLA_OK"), ("MaxPool", "dla", "DLA_OK"),
        ("Conv", "gpu", "DLA_CONV_KERNEL"), ("MaxPool", "gpu", "DLA_POOL_WINDOW"),
        ("Reshape", "gpu", "DLA_SHUFFLE"), ("Gemm", "gpu", "DLA_MATMUL"), ("Softmax", "dla", "DLA_OK"),
        ("LSTM", "gpu", "DLA_NO_RNN"), ("NonMaxSuppression", "unsupported", "PARSER_UNSUPPORTED")]


def test_xavier_softmax_and_orin_nano_without_dla(graph_path):
    xavier = dict((k, p) for k, (op, p, c) in enumerate(_places(graph_path, "jetson-xavier-nx")))
    assert xavier[7] == "gpu"                                         # Softmax: DLA v2 (Orin) only
    nano = _places(graph_path, "jetson-orin-nano")
    assert {(p, c) for op, p, c in nano if op != "NonMaxSuppression"} == {("gpu", "NO_DLA")}


def test_report_names_the_lstm_fallback(graph_path):
    rep = tensorrt_report(str(graph_path), load_board("jetson-orin-nx"), "fp16")
    lstm = next(o for o in rep.ops if o.op == "LSTM")
    assert lstm.reason == "LSTM: not supported on DLA (no recurrent layers), GPU fallback"
    assert lstm.status == "GPU (fallback)" and lstm.kernel == "GPU"
    assert rep.verdict == "predicted" and "engine inspector" in rep.verdict_source
    assert rep.counts == {"dla": 4, "gpu": 5, "unsupported": 1}
