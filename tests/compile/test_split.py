"""Segment models: a model cut into segments and run as a chain reproduces the whole model bit for bit."""
import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter

from edgehft import runtime
from edgehft.compiler.split import split


def _chain(segs, x_raw, first_input):
    its = []
    for sg in segs:
        it = Interpreter(model_content=sg.data)
        it.allocate_tensors()
        its.append(it)
    outs = []
    for x in x_raw:
        env = {first_input: x[None]}
        for sg, it in zip(segs, its):
            it.reset_all_variables()
            for d, name in zip(it.get_input_details(), sg.inputs):
                it.set_tensor(d["index"], env[name])
            it.invoke()
            for d, name in zip(it.get_output_details(), sg.outputs):
                env[name] = it.get_tensor(d["index"]).copy()
        outs.append(env[segs[-1].outputs[0]][0])
    return np.stack(outs)


def test_deeplob_segments_chain_bit_exact(deeplob_bundle, deeplob_windows):
    data = (deeplob_bundle / "model.tflite").read_bytes()
    segs = split(data, [list(range(31)), [31], [32], [33], [34]])
    assert [s.inputs for s in segs[1:]] == [[s.outputs[0]] for s in segs[:-1]]
    assert segs[1].outputs == ["tfl.unidirectional_sequence_lstm"]
    xs = deeplob_windows["x"][:200]
    raw_in, raw_out = [], []
    with runtime.open(deeplob_bundle) as r:
        for x in xs:
            raw_out.append(r.predict_raw(x)[0].copy())
            raw_in.append(r.inputs[0].dest[0].copy())
        first = Interpreter(model_path=str(deeplob_bundle / "model.tflite")).get_input_details()[0]["name"]
    got = _chain(segs, np.stack(raw_in), first)
    assert np.array_equal(got, np.stack(raw_out))


def test_split_rejects_bad_indices(deeplob_bundle):
    with pytest.raises(ValueError, match="outside"):
        split((deeplob_bundle / "model.tflite").read_bytes(), [[0, 99]])
