"""The cpu board's ``native-bf16`` plan: the float graph with its CONV_2D ops (a following LEAKY_RELU fused)
and each LSTM's input projection on edgehft's bf16 conv kernel, the LSTM recurrence on the fp32 kernel,
the MAX_POOL_2D / RESHAPE between them native too.

Compiled by name (``--quant native-bf16``), so it is tested on every machine: where AMX is missing the
conv kernel's portable loop runs it. An independent chain (LiteRT per segment, float64 convs of the
bf16-rounded operands, a float64 Keras LSTM) must reproduce the golden vectors. No timed assertions.
"""
import json

import numpy as np
import pytest

from edgehft import runtime
from edgehft.bundle import load_bundle
from edgehft.bundle_checks import check_golden
from edgehft.compiler.pipeline import CompileOptions, compile_model
from edgehft.report import Report

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bf16_bundle(models, tmp_path_factory):
    """k3_cnn_lstm.keras (Conv2D 1x2/2 + LeakyReLU, Conv2D 4x1 SAME + LeakyReLU, MaxPool, two Conv2D 1x4
    concatenated, LSTM(16), Dense softmax) compiled with --quant native-bf16."""
    out = tmp_path_factory.mktemp("bf16") / "cnn.bf16"
    compile_model(models / "k3_cnn_lstm.keras", [models / "calib.npy"], out,
                  CompileOptions(board="cpu", quant="native-bf16"))
    return out


def test_bundle_runs_convs_and_lstm_projection_natively(bf16_bundle):
    b = load_bundle(bf16_bundle)
    assert b.manifest.quantization.mode == "native-bf16" and b.manifest.artifacts["native"] == "native.json"
    assert b.manifest.format_version == 4      # its LSTM's bf16 recurrent kernel: an older edgehft refuses it
    graph = json.loads((bf16_bundle / "native.json").read_text())
    steps = graph["steps"]
    assert [st.get("recurrent") for st in steps if st["kind"] == "lstm"] == ["bf16"]
    # RESHAPE of the input, conv+lrelu, conv+lrelu, max pool, two convs, CONCATENATION, RESHAPE, projection,
    # LSTM, its last step (a STRIDED_SLICE view), Dense, softmax: no LiteRT segment left
    assert [s["kind"] for s in steps] == ["reshape", "conv2d", "conv2d", "maxpool", "conv2d", "conv2d", "concat",
                                          "reshape", "conv2d", "lstm", "slice", "fc", "softmax"]
    assert steps[10]["index"][1] == {"index": -1} and steps[11]["shape"] == [1, 3]
    assert steps[3]["filter"] == [3, 1] and steps[3]["padding"] == "SAME" and steps[7]["shape"] == [1, 20, 24]
    assert steps[6]["input_shapes"] == [[1, 20, 1, 16], [1, 20, 1, 8]] and steps[6]["axis"] in (3, -1)
    convs = [s for s in steps if s["kind"] == "conv2d"]
    # the two Conv2D + LeakyReLU pairs are fused; the 1x4 conv has no activation; the last is the projection
    assert [s["activation"] for s in convs] == ["leaky_relu", "leaky_relu", "none", "none", "none"]
    assert convs[0]["alpha"] == pytest.approx(0.01) and len(convs[0]["ops"]) == 2
    assert (convs[0]["stride"], convs[0]["padding"], convs[1]["padding"]) == ([1, 2], "VALID", "SAME")
    assert convs[4]["what"] == "LSTM input projection" and steps[9]["projected"]
    assert graph["conv_left_on_litert"] == {}
    rep = Report.model_validate_json((bf16_bundle / "report.json").read_text())
    kernels = {o.op: {p.kernel for p in rep.ops if p.op == o.op} for o in rep.ops}
    assert kernels["CONV_2D"] == kernels["LEAKY_RELU"] == kernels["UNIDIRECTIONAL_SEQUENCE_LSTM"] == {"native"}
    assert kernels["MAX_POOL_2D"] == kernels["RESHAPE"] == kernels["CONCATENATION"] == {"native"}
    assert kernels["STRIDED_SLICE"] == kernels["FULLY_CONNECTED"] == kernels["SOFTMAX"] == {"native"}
    assert any("bf16" in n for n in rep.notes)
    with runtime.open(bf16_bundle) as r:
        d = r.describe()
        assert d["steps"].count("conv2d") == 5 and "CONV_2D (" in d["interpreter"] and "maxpool" in d["steps"]
        g = check_golden(r)
        assert g["ok"] and g["count"] == 16


def test_independent_chain_reproduces_the_golden_vectors(bf16_bundle):
    """LiteRT on each segment, float64 convs of bf16-rounded operands (the kernel's documented numerics)
    and a float64 Keras LSTM on the bf16 projection reproduce the bundle's golden outputs."""
    from native_reference import bf16, reference_conv, reference_lstm, reference_maxpool, run_segment
    b = load_bundle(bf16_bundle)
    graph = json.loads((bf16_bundle / "native.json").read_text())
    ins, outs = b.golden()
    x, y = ins[b.manifest.inputs[0].name], outs[b.manifest.outputs[0].name]
    its = {}
    for n in range(len(x)):
        env = {graph["inputs"][0]: x[n:n + 1]}
        for st in graph["steps"]:
            src = env[st["inputs"][0]]
            if st["kind"] == "litert":
                run_segment(bf16_bundle, st, env, its)
                continue
            if st["kind"] == "reshape":
                env[st["outputs"][0]] = src.reshape(st["shape"])
                continue
            if st["kind"] == "slice":
                idx = tuple(slice(d["start"], d["stop"], d["step"]) if "index" not in d else d["index"]
                            for d in st["index"])
                env[st["outputs"][0]] = src[idx].reshape(st["shape"])
                continue
            if st["kind"] == "softmax":
                z = np.exp(st["beta"] * (src.astype(np.float64) - src.max(-1, keepdims=True)))
                env[st["outputs"][0]] = (z / z.sum(-1, keepdims=True)).astype(np.float32)
                continue
            if st["kind"] == "concat":
                env[st["outputs"][0]] = np.concatenate([env[n] for n in st["inputs"]], st["axis"])
                continue
            if st["kind"] == "maxpool":
                H, W = st["in_hw"]
                out = reference_maxpool(src.reshape(H, W, -1), st["filter"], st["stride"], st["padding"],
                                        st["activation"])
                env[st["outputs"][0]] = out[None]
                continue
            w = np.load(bf16_bundle / st["weights"])
            if st["kind"] == "fc":
                z = src.reshape(st["rows"], -1).astype(np.float64) @ w["weights"].T.astype(np.float64)
                env[st["outputs"][0]] = (z + (w["bias"] if "bias" in w.files else 0)).reshape(st["shape"]).astype(
                    np.float32)
                continue
            if st["kind"] == "conv2d":
                H, W = st["in_hw"]
                xin = src.reshape(H, W, st["channels"])
                out, _ = reference_conv(bf16(xin), bf16(w["weights"]), w["bias"] if "bias" in w.files else None,
                                        st["stride"], st["padding"], st["activation"], st["alpha"])
                env[st["outputs"][0]] = out[None].astype(np.float32)
            else:                                     # the recurrence on the projection: z = g + h @ bf16(U)
                g = src.reshape(st["timesteps"], -1)
                G = g.shape[1]
                U = bf16(w["recurrent_kernel"]) if st.get("recurrent") == "bf16" else w["recurrent_kernel"]
                h = reference_lstm([(np.eye(G), U, np.zeros(G))], g, True, float(w["cell_clip"]))
                env[st["outputs"][0]] = h[None].astype(np.float32)
        assert np.abs(env[graph["outputs"][0]] - y[n:n + 1]).max() < 1e-5


def test_drift_is_measured_against_keras_float(bf16_bundle):
    rep = Report.model_validate_json((bf16_bundle / "report.json").read_text())
    assert rep.drift is not None and rep.drift.passed
    assert "native-bf16" in rep.drift.candidate


def test_a_damaged_chain_is_a_bundle_error(bf16_bundle, tmp_path):
    """An unknown step kind, a missing field, or a step whose kernel was built for another size than the
    tensor it is handed: BundleError (exit 6) with a hint, never a read past a buffer or a traceback."""
    import shutil

    from edgehft.boards import load_board
    from edgehft.errors import BundleError
    from edgehft.runtime import cpu
    from edgehft.runtime.native_chain import Chain
    graph = json.loads((bf16_bundle / "native.json").read_text())

    def damaged(edit):
        d = tmp_path / f"b{len(list(tmp_path.iterdir()))}"
        shutil.copytree(bf16_bundle, d)
        g = json.loads(json.dumps(graph))
        edit(g["steps"])
        (d / "native.json").write_text(json.dumps(g))
        return d
    d = damaged(lambda steps: steps[3].update(kind="avgpool"))
    with pytest.raises(BundleError, match="unknown step kind 'avgpool'") as e:
        Chain(d, "native.json", 1, "auto")
    assert e.value.exit_code == 6 and "recompile" in e.value.hint
    with pytest.raises(BundleError, match="KeyError: 'in_hw'"):
        Chain(damaged(lambda steps: steps[1].pop("in_hw")), "native.json", 1, "auto")
    d = damaged(lambda steps: steps[6].update(input_shapes=[[1, 20, 1, 16], [1, 20, 1, 16]]))   # concat
    with pytest.raises(BundleError, match=r"gets \[320, 160\] values, its kernel takes \[320, 320\]"):
        cpu.Runner(load_bundle(d, verify=False), load_board("cpu"))


def test_a_nan_in_the_golden_outputs_is_refused(bf16_bundle, tmp_path):
    """A golden vector must be reproducible: a NaN in one is a bundle error (exit 6), never a comparison
    that NaN != NaN silently fails or passes."""
    import shutil
    d = tmp_path / "nan"
    shutil.copytree(bf16_bundle, d)
    with np.load(d / "golden.npz") as z:
        arrays = {k: z[k].copy() for k in z.files}
    out = next(k for k in arrays if not k.startswith("in"))
    arrays[out][3, 0] = np.nan
    np.savez(d / "golden.npz", **arrays)
    from edgehft.boards import load_board
    from edgehft.runtime import cpu
    from edgehft.errors import BundleError
    r = cpu.Runner(load_bundle(d, verify=False), load_board("cpu"))
    with pytest.raises(BundleError, match="outputs/probs holds 1 NaN or inf values") as exc:
        check_golden(r)
    r.close()
    assert exc.value.exit_code == 6


def test_a_concat_with_a_constant_operand_stays_on_litert(models, tmp_path):
    """constcat_savedmodel: conv, concat with a constant tensor, conv, Dense, softmax. The native concat
    takes only tensors the chain hands over, so this one runs on LiteRT and the next conv gets all 6
    channels (it once got 4 and read past its buffer)."""
    out = tmp_path / "cc"
    compile_model(models / "constcat_savedmodel", [models / "calib.npy"], out,
                  CompileOptions(board="cpu", quant="native-bf16"))
    steps = json.loads((out / "native.json").read_text())["steps"]
    assert [s["kind"] for s in steps] == ["reshape", "conv2d", "litert", "conv2d", "reshape", "fc", "softmax"]
    assert steps[3]["channels"] == 6
    rep = Report.model_validate_json((out / "report.json").read_text())
    assert rep.drift.passed and max(o.mae_rel for o in rep.drift.outputs) < 0.01
    with runtime.open(out) as r:
        assert check_golden(r)["ok"]


def test_profile_times_the_calls_predict_makes(bf16_bundle):
    """bench --profile on a bound chain times the bound calls themselves: a view (reshape, slice) makes
    no call and shows 0; every kernel step shows its call; predict still reproduces the golden vectors."""
    from edgehft.bench.profile import profile_runner
    with runtime.open(bf16_bundle) as r:
        assert r._bound_steps is not None
        prof = profile_runner(r, None, rounds=5, warmup=1)
        assert check_golden(r)["ok"]
    kinds = [s["kind"] for s in json.loads((bf16_bundle / "native.json").read_text())["steps"]]
    for kind, seg in zip(kinds, prof["segments"]):
        assert (seg["us"]["p50"] == 0) == (kind in ("reshape", "slice")), (kind, seg)


def test_linked_convs_on_the_hot_path_give_the_unlinked_bits(bf16_bundle, monkeypatch):
    """Where the convs keep bf16 inputs (AMX or AVX512_BF16), predict links the conv+lrelu -> conv+lrelu pair
    (the second reads only the first) and skips the fp32 tensor between them; its outputs are np.array_equal
    to those of the same bundle opened with nothing linked and the calls made one by one from Python (not as
    one native call list), also after the general path ran in between. On a CPU
    without either, nothing is linked."""
    from edgehft.runtime import native_chain
    with runtime.open(bf16_bundle) as r:
        links = native_chain.conv_links(r._chain)
        convs = [i for i, (kind, _) in enumerate(r._chain.steps) if kind == "conv2d"]
        assert links == ({convs[0]: convs[1]} if r._chain.steps[convs[0]][1][0].linkable else {})
        assert r._invoke.__name__ == "invoke_native"            # every call a kernel's: one native call
        monkeypatch.setattr(native_chain, "conv_links", lambda chain: {})
        monkeypatch.setattr(native_chain, "native_calls", lambda calls: None)
        with runtime.open(bf16_bundle) as unlinked:
            assert unlinked._invoke.__name__ == "invoke_bound"  # one ctypes call per kernel, nothing linked
            rng = np.random.default_rng(4)
            for _ in range(5):
                x = rng.standard_normal(r._in_specs[0].shape).astype(np.float32)
                assert np.array_equal(r.predict(x), unlinked.predict(x))
            # the general path (every step on its own tensors, as bench --profile without a bound chain runs it)
            # on another window between two predicts leaves the hot path's hand-overs alone (the concat's input
            # pointers included)
            other = rng.standard_normal(r._in_specs[0].shape).astype(np.float32)
            want = r.predict(x).copy()
            np.copyto(r._staging_in[0], other)
            native_chain.invoke(r._chain, r._staging_in, r._staging_out)
            assert not np.array_equal(r._staging_out[0], want)
            assert np.array_equal(r.predict(x), want)
