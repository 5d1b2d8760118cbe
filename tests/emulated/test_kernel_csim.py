"""The FPGA kernels' C++ (bitstreams/kernels, through ctypes: edgehft.kernels.fpga.csim) against the numpy
golden model (edgehft.kernels.fpga.reference) and LiteRT 2.3.0, bit for bit; the blob layout; the kernels'
slot protocol; the KernelModel classes the emulated board runs; the HLS C testbenches under g++."""
from __future__ import annotations

import os
import shutil
import subprocess
import time

import numpy as np
import pytest

from edgehft.errors import BoardUnavailableError
from edgehft.ir.tflite_model import TFLiteModel
from edgehft.kernels.fpga import blob as B
from edgehft.kernels.fpga import params as P
from edgehft.kernels.fpga import reference as R
from edgehft.kernels.fpga.csim import (CSimDenseKernel, CSimLstmKernel, KernelLibrary, KernelStatusError, kernel_sources,
                                  write_testbench_vectors)
from kernel_io import (FC_MODE, PATHS, capture, deeplob_inputs, kernel_models, op_io,  # noqa: F401
                       patch_scales, stress_inputs)

pytestmark = pytest.mark.needs("g++")

slow = pytest.mark.slow
FC_MODES = ("gemmlowp", "ruy-x86", "fp32", "single", "float64")


@pytest.fixture(scope="module")
def lib():
    return KernelLibrary()


def run_fc(lib, blob, x, slot=0, load=True):
    x = np.ascontiguousarray(x, np.int8).reshape(-1, blob.dims["n_in"])
    n_in, n_out = blob.dims["n_in"], blob.dims["n_out"]
    if load:
        assert lib.dense(0, 0, n_in, n_out, blob.weights, blob.params, slot=slot) == 0
    y = np.full((len(x), n_out), 0x5A, np.int8)
    assert lib.dense(1, len(x), n_in, n_out, x=x, y=y, slot=slot) == 0
    return y


def run_lstm(lib, blob, xs, slot=0, load=True):
    n_in, n_h = blob.dims["n_in"], blob.dims["n_hidden"]
    if load:
        assert lib.lstm(0, 0, n_in, n_h, blob.weights, blob.params, slot=slot) == 0
    ys = np.full((len(xs), xs.shape[1], n_h), 0x5A, np.int8)
    for x, y in zip(xs, ys):                                   # one window per call, from reset state
        assert lib.lstm(1, len(x), n_in, n_h, x=x, y=y, slot=slot) == 0
    return ys


def rows_differ(a, b) -> int:
    return int(np.any(a.reshape(len(a), -1) != b.reshape(len(b), -1), axis=1).sum())


# ---- random layers with nonzero zero points ------------------------------------------------------

def random_fc(rng, n_in, n_out, per_channel=True, act=(-128, 127), in_zp=None, out_zp=None):
    w = rng.integers(-127, 128, (n_out, n_in)).astype(np.int8)
    w[0], w[-1] = 127, -128                                     # saturated rows
    s_in, s_out = np.float32(0.05), np.float32(1.0)
    w_scales = rng.uniform(0.5, 2.0, n_out if per_channel else 1).astype(np.float32)
    w_scales *= np.float32(60.0 / (5500 * np.sqrt(n_in)) / float(s_in))     # outputs span int8 and saturate
    pairs = [P.quantize_multiplier(float(s_in) * float(s) / float(s_out)) for s in w_scales] if per_channel else \
        [P.quantize_multiplier(float(s_in * w_scales[0]) / float(s_out))] * n_out
    return P.FullyConnectedParams(
        weights=w, bias=rng.integers(-60000, 60000, n_out).astype(np.int32),
        input_zero_point=int(rng.integers(-128, 128) if in_zp is None else in_zp),
        output_zero_point=int(rng.integers(-100, 100) if out_zp is None else out_zp),
        multiplier=np.array([m for m, _ in pairs], np.int64), shift=np.array([s for _, s in pairs], np.int64),
        activation_min=act[0], activation_max=act[1], per_channel=per_channel, input_scale=float(s_in),
        output_scale=float(s_out), weight_scales=w_scales)


def random_lstm(rng, n_in, n_h, cell_exp=-11, clip=0, zps=(-37, 5, 9)):
    in_zp, h_zp, hid_zp = zps
    gates = {}
    for g in P.GATES:
        wx = rng.integers(-127, 128, (n_h, n_in)).astype(np.int8)
        wh = rng.integers(-127, 128, (n_h, n_h)).astype(np.int8)
        bias = rng.integers(-2 ** 14, 2 ** 14, n_h).astype(np.int32)
        b_x = B._wrap32(bias.astype(np.int64) + P._row_sums_times(wx, -in_zp))
        mx, sx = P.quantize_multiplier(10 ** rng.uniform(-1.5, 0.5) / np.sqrt(n_in))   # Q3.12 gates: +-0.05..5
        mh, sh = P.quantize_multiplier(10 ** rng.uniform(-1.5, 0.5) / np.sqrt(n_h))
        gates[g] = P.LstmGateParams(wx, wh, bias, b_x, P._row_sums_times(wh, -h_zp), mx, sx, mh, sh)
    hm, hs = P.quantize_multiplier(2.0 ** -30 / 2.0 ** rng.uniform(-8, -5))
    return P.LstmParams(gates, n_in, n_h, n_h, in_zp, h_zp, hid_zp, hid_zp, hm, hs, cell_exp, clip, False,
                        float(np.float32(0.05)), float(np.float32(0.01)), float(np.float32(0.01)))


def saturating(rng, shape):
    x = rng.integers(-128, 128, shape).astype(np.int8)
    x[0], x[1] = -128, 127
    return x


# ---- fixed-point helpers -------------------------------------------------------------------------

def test_activations_match_on_every_int16(lib):
    x = np.arange(-32768, 32768)
    np.testing.assert_array_equal(lib.sigmoid_int16(x), R.sigmoid_int16(x))
    for bits in range(7):
        np.testing.assert_array_equal(lib.tanh_int16(x, bits), R.tanh_int16(x, bits))


def test_multiply_by_quantized_multiplier_modes(lib):
    rng = np.random.default_rng(1)
    x = np.concatenate([[-2 ** 31, 2 ** 31 - 1, 0, -1, 1], rng.integers(-2 ** 31, 2 ** 31, 50000),
                        rng.integers(-3000, 3000, 50000)])
    for mode in ("gemmlowp", "ruy-x86", "single"):
        for shift in (-31, -20, -9, -8, -1, 0, 1, 7, 30) + ((-40, 31, 40) if mode != "single" else ()):
            m = (1 << 30) if shift == -8 else int(rng.integers(1 << 30, 1 << 31))
            np.testing.assert_array_equal(lib.mbqm(x, m, shift, mode),
                                          R.multiply_by_quantized_multiplier(x, m, shift, mode),
                                          err_msg=f"{mode} shift {shift}")


def test_float_requantize_rounds_like_numpy(lib):
    """fp32: float32(acc) and the float32 product each round (to nearest even) before rint; a double
    product (or a fused multiply-add) would differ near x.5. float64: ties away from zero."""
    acc = np.concatenate([np.arange(-2 ** 20, 2 ** 20), np.random.default_rng(8).integers(-2 ** 31, 2 ** 31, 10 ** 6)])
    for scale in (np.float32(0.000977), np.float32(3.1e-7), np.float32(2.0 ** -9)):
        f32 = np.rint((acc.astype(np.float32) * scale).astype(np.float32)).astype(np.int64)
        exact = np.rint(acc * np.float64(scale)).astype(np.int64)
        keep = np.abs(f32) < 2 ** 20                             # the kernel clamps beyond (int8 output anyway)
        assert scale == np.float32(2.0 ** -9) or (f32 != exact)[keep].sum() > 20
        np.testing.assert_array_equal(lib.requantize(acc, 0, 0, scale, 0.0, "fp32")[keep], f32[keep])
        s64 = float(scale) * 1.0000001
        v = np.abs(acc * s64)
        away = np.where(acc < 0, -1, 1) * (np.floor(v) + (v - np.floor(v) >= 0.5))
        np.testing.assert_array_equal(lib.requantize(acc, 0, 0, 0.0, s64, "float64")[keep], away[keep])


# ---- blob layout ---------------------------------------------------------------------------------

def test_blob_round_trip_and_layout():
    rng = np.random.default_rng(2)
    for per_channel in (True, False):
        p = random_fc(rng, 37, 9, per_channel, act=(-20, 90))
        for mode in FC_MODES:
            blob = B.pack_fc(p, mode, rows=3)
            assert blob.dims == {"rows": 3, "n_in": 37, "n_out": 9} and blob.params.size == 32 + 7 * 9
            q, m = B.unpack_fc(B.KernelBlob.from_arrays(blob.weights, blob.params))
            assert m == mode
            for f in ("weights", "bias", "multiplier", "shift", "weight_scales"):
                np.testing.assert_array_equal(getattr(q, f), getattr(p, f), err_msg=f)
            assert q.input_scale == p.input_scale and q.output_scale == p.output_scale
            assert (q.input_zero_point, q.output_zero_point, q.activation_min, q.activation_max, q.per_channel) == \
                (p.input_zero_point, p.output_zero_point, -20, 90, per_channel)
    p = random_lstm(rng, 11, 6, cell_exp=-13, clip=1234)
    blob = B.pack_lstm(p, steps=5)
    assert blob.dims == {"steps": 5, "n_in": 11, "n_hidden": 6} and blob.weights.size == 4 * 6 * 17
    w = blob.weights.reshape(4, 6, 17)
    np.testing.assert_array_equal(w[2, :, :11], p.gates["cell"].input_weights)
    np.testing.assert_array_equal(w[3, :, 11:], p.gates["output"].recurrent_weights)
    q, rounding = B.unpack_lstm(blob)
    assert rounding == "gemmlowp" and q.gates.keys() == p.gates.keys()
    for g in P.GATES:                                            # raw biases recovered from the effective ones
        assert all(np.array_equal(a, b) for a, b in zip(q.gates[g].__dict__.values(), p.gates[g].__dict__.values()))
    assert q.__class__(**{**q.__dict__, "gates": p.gates}) == p
    with pytest.raises(ValueError, match="not one the kernel runs"):
        B.pack_lstm(p, "ruy-x86")
    with pytest.raises(ValueError, match="not one the kernel runs"):
        B.pack_fc(random_fc(rng, 4, 2), "nearest")
    bad = blob.params.copy()
    bad[0] ^= 1
    with pytest.raises(ValueError, match="not an edgehft kernel blob"):
        B.read_header(bad)
    with pytest.raises(ValueError, match="truncated"):
        B.read_header(blob.params[:-1])


# ---- kernels against numpy, random stress --------------------------------------------------------

@pytest.mark.parametrize("n_in, n_out, per_channel, act", [(1, 1, True, (-128, 127)), (16, 8, True, (-5, 127)),
                                                           (33, 17, False, (-128, 100)),
                                                           (4096, 1024, True, (-128, 127))])
def test_dense_matches_reference_in_every_mode(lib, n_in, n_out, per_channel, act):
    rng = np.random.default_rng(n_in)
    p = random_fc(rng, n_in, n_out, per_channel, act)
    x = saturating(rng, (max(4, 200000 // (n_in * n_out) + 4), n_in))
    for mode in FC_MODES:
        ref = R.fully_connected_int8(x, p, mode)
        np.testing.assert_array_equal(run_fc(lib, B.pack_fc(p, mode), x), ref, err_msg=mode)
        assert len(np.unique(ref)) > min(20, n_out) or n_out == 1        # not all saturated


def test_dense_ties_every_mode_rounds_its_own_way(lib):
    """Effective scale exactly 2^-9: the accumulators hit exact ties and double-rounding points."""
    rng = np.random.default_rng(3)
    p = random_fc(rng, 16, 8, per_channel=False, in_zp=7, out_zp=-3)
    p = P.FullyConnectedParams(**{**p.__dict__, "input_scale": 2.0 ** -6, "output_scale": 2.0 ** -3,
                                  "weight_scales": np.float32([2.0 ** -6]), "multiplier": np.full(8, 1 << 30),
                                  "shift": np.full(8, -8)})
    x = saturating(rng, (20000, 16))
    outs = {m: R.fully_connected_int8(x, p, m) for m in FC_MODES}
    for mode, ref in outs.items():
        np.testing.assert_array_equal(run_fc(lib, B.pack_fc(p, mode), x), ref, err_msg=mode)
    assert all((outs[a] != outs[b]).any() for a in FC_MODES for b in FC_MODES if a < b)


@pytest.mark.parametrize("n_in, n_h, cell_exp, clip, zps", [(1, 1, -11, 0, (0, 0, 0)), (7, 5, -15, 0, (-128, 127, 3)),
                                                            (16, 33, -9, 600, (-37, 5, 9)),
                                                            (512, 256, -11, 8000, (-126, -1, -1))])
def test_lstm_matches_reference(lib, n_in, n_h, cell_exp, clip, zps):
    rng = np.random.default_rng(n_in + n_h)
    p = random_lstm(rng, n_in, n_h, cell_exp, clip, zps)
    steps = 40 if n_in < 512 else 6
    x = saturating(rng, (6, steps, n_in))
    x[2, ::2] = -128
    x[2, 1::2] = 127
    for rounding in ("gemmlowp", "single"):
        ref = R.lstm_int8(x, p, rounding=rounding)
        assert len(np.unique(ref)) > 10 or n_h == 1
        np.testing.assert_array_equal(run_lstm(lib, B.pack_lstm(p, rounding), x), ref, err_msg=rounding)


# ---- the slot protocol ---------------------------------------------------------------------------

def test_refusals_leave_y_alone():
    lib = KernelLibrary()                                        # a fresh board: nothing loaded
    rng = np.random.default_rng(4)
    fc, lstm = B.pack_fc(random_fc(rng, 12, 5), "ruy-x86"), B.pack_lstm(random_lstm(rng, 6, 4))
    x, y = saturating(rng, (3, 12)), np.full((3, 5), 0x5A, np.int8)
    xs, ys = saturating(rng, (7, 6)), np.full((7, 4), 0x5A, np.int8)
    assert lib.dense(1, 3, 12, 5, x=x, y=y, slot=0) == 5                 # mode 1 before mode 0
    assert lib.lstm(1, 7, 6, 4, x=xs, y=ys, slot=0) == 5
    assert lib.dense(0, 0, 12, 5, fc.weights, fc.params, slot=4) == 2    # no slot 4
    assert lib.dense(0, 0, 4097, 5, fc.weights, fc.params, slot=0) == 3  # over the limits
    assert lib.dense(0, 0, 12, 6, fc.weights, fc.params, slot=0) == 4    # args disagree with the blob
    assert lib.dense(0, 0, 12, 5, lstm.weights, lstm.params, slot=0) == 4    # an LSTM blob
    bad = fc.params.copy()
    bad[7] = 9
    assert lib.dense(0, 0, 12, 5, fc.weights, bad, slot=0) == 7          # unknown requantize mode
    assert lib.slot("dense_int8", 0)["loaded"] == 0
    assert lib.dense(0, 0, 12, 5, fc.weights, fc.params, slot=0) == 0
    assert lib.dense(1, 3, 11, 5, x=x, y=y, slot=0) == 6                 # sizes differ from the slot's
    assert lib.dense(2, 3, 12, 5, x=x, y=y, slot=0) == 1                 # no mode 2
    assert lib.lstm(0, 0, 6, 4, lstm.weights, lstm.params, slot=0) == 0
    assert lib.lstm(1, 513, 6, 4, x=np.zeros((513, 6), np.int8), y=np.zeros((513, 4), np.int8), slot=0) == 3
    assert (y == 0x5A).all() and (ys == 0x5A).all()
    assert lib.dense(1, 3, 12, 5, x=x, y=y, slot=0) == 0 and not (y == 0x5A).all()
    lib.reset()
    assert lib.dense(1, 3, 12, 5, x=x, y=y, slot=0) == 5


def test_slots_and_boards_are_independent(lib):
    rng = np.random.default_rng(5)
    fcs = [random_fc(rng, 24, 10), random_fc(rng, 40, 3, per_channel=False)]
    lstms = [random_lstm(rng, 9, 8), random_lstm(rng, 5, 12, cell_exp=-12)]
    for slot, (f, l) in enumerate(zip(fcs, lstms)):
        bf, bl = B.pack_fc(f, "fp32"), B.pack_lstm(l)
        assert lib.dense(0, 0, f.n_in, f.n_out, bf.weights, bf.params, slot=slot) == 0
        assert lib.lstm(0, 0, l.n_input, l.n_cell, bl.weights, bl.params, slot=slot) == 0
    for slot in (1, 0, 1):                                       # each slot keeps its own layer
        f, l = fcs[slot], lstms[slot]
        x, xs = saturating(rng, (5, f.n_in)), saturating(rng, (3, 20, l.n_input))
        np.testing.assert_array_equal(run_fc(lib, B.pack_fc(f, "fp32"), x, slot, load=False),
                                      R.fully_connected_int8(x, f, "fp32"))
        np.testing.assert_array_equal(run_lstm(lib, B.pack_lstm(l), xs, slot, load=False), R.lstm_int8(xs, l))
    other = KernelLibrary(lib.path)                              # another board: its own on-chip memory
    assert other.slot("dense_int8", 0)["loaded"] == 0 and lib.slot("dense_int8", 0)["loaded"] == 1


# ---- KernelModel classes on a fake device memory -------------------------------------------------

class FakeMem:
    """Device memory: ``{address: bytearray}``; an access must fall inside one buffer."""

    def __init__(self):
        self.bufs, self.reads, self._next = {}, [], 0x4000_0000

    def alloc(self, data) -> int:
        addr, self._next = self._next, self._next + (len(data) + 0x1FFF) // 0x1000 * 0x1000
        self.bufs[addr] = bytearray(data)
        return addr

    def _at(self, addr, n):
        hits = [(b, addr - a) for a, b in self.bufs.items() if a <= addr and addr + n <= a + len(b)]
        if not hits:
            raise IndexError(f"no buffer holds [{addr:#x}, +{n})")
        return hits[0]

    def read(self, addr, n):
        (buf, off), _ = self._at(addr, n), self.reads.append((addr, n))
        return bytes(buf[off:off + n])

    def write(self, addr, data):
        buf, off = self._at(addr, len(data))
        buf[off:off + len(data)] = data


def test_kernel_models_on_fake_memory():
    lib = KernelLibrary()
    rng = np.random.default_rng(6)
    p, l = random_fc(rng, 20, 6), random_lstm(rng, 10, 7)
    mem, dense, lstm = FakeMem(), CSimDenseKernel(lib), CSimLstmKernel(lib)
    x, xs = saturating(rng, (4, 20)), saturating(rng, (30, 10))
    for model, blob, xin, key in ((dense, B.pack_fc(p, "ruy-x86", rows=4), x, "rows"),
                                  (lstm, B.pack_lstm(l, steps=30), xs, "steps")):
        n_out = blob.dims.get("n_out", blob.dims.get("n_hidden"))
        args = {**blob.dims, "weights": mem.alloc(blob.weights.tobytes()), "params": mem.alloc(blob.params.tobytes()),
                "x": mem.alloc(xin.tobytes()), "y": mem.alloc(b"\x5a" * (len(xin) * n_out)), "slot": 2}
        model.run({**args, "mode": 1}, mem)                      # before mode 0: refused, y untouched
        assert model.last_status == 5 and model.refused == 1 and mem.bufs[args["y"]] == b"\x5a" * (len(xin) * n_out)
        model.run({**args, "mode": 0}, mem)
        model.run({**args, "mode": 1}, mem)
        assert model.last_status == 0
        got = np.frombuffer(bytes(mem.bufs[args["y"]]), np.int8).reshape(len(xin), n_out)
        want = R.fully_connected_int8(xin, p) if key == "rows" else R.lstm_int8(xin[None], l)[0]
        np.testing.assert_array_equal(got, want)
    mem.reads.clear()                                            # over the limits: the kernel reads nothing
    dense.run({"mode": 0, "rows": 0, "n_in": 5000, "n_out": 6, "weights": 0, "params": 0, "x": 0, "y": 0,
               "slot": 0}, mem)
    assert dense.last_status == 3 and mem.reads == []
    with pytest.raises(KernelStatusError, match="never loaded"):
        CSimDenseKernel(lib, strict=True).run({**args, "mode": 1, "rows": 1, "n_in": 20, "n_out": 6, "slot": 3}, mem)


# ---- DeepLOB: numpy, C++ and LiteRT on the 16 golden + 200 real windows --------------------------

@pytest.fixture(scope="module")
def deeplob(deeplob_bundle, deeplob_windows):
    bundle, model, inputs, lstm, fc = deeplob_inputs(deeplob_bundle, deeplob_windows)
    tensors = (lstm.inputs[0], lstm.outputs[0], fc.inputs[0], fc.outputs[0])
    return model, lstm, fc, {kind: capture(bundle.model_path, inputs, kind, tensors) for kind in PATHS}


@slow
@pytest.mark.parametrize("kind", PATHS)
def test_deeplob_lstm_three_views(lib, deeplob, kind):
    model, lstm, _, caps = deeplob
    x, litert = caps[kind][lstm.inputs[0]], caps[kind][lstm.outputs[0]]
    assert x.shape == (216, 100, 192) and lstm.index == 31
    blob = B.pack_op(model, lstm)
    assert blob.dims == {"steps": 100, "n_in": 192, "n_hidden": 64}
    cpp = run_lstm(lib, blob, x, slot=1)
    assert rows_differ(R.lstm_int8(x, P.lstm_params(model, lstm)), litert) == 0
    assert rows_differ(cpp, litert) == 0                                 # 216 of 216 windows


@slow
@pytest.mark.parametrize("kind", PATHS)
def test_deeplob_fc_three_views(lib, deeplob, kind):
    model, _, fc, caps = deeplob
    x, litert = caps[kind][fc.inputs[0]], caps[kind][fc.outputs[0]]
    assert x.shape == (216, 64) and fc.index == 33
    p = P.fully_connected_params(model, fc)
    for mode in FC_MODES:                                     # C++ == numpy in every mode, one call of 216 rows
        np.testing.assert_array_equal(run_fc(lib, B.pack_fc(p, mode, rows=216), x), R.fully_connected_int8(x, p, mode))
    cpp = run_fc(lib, B.pack_op(model, fc, FC_MODE[kind]), x)
    assert rows_differ(cpp, litert) == 0                      # the mode of this path == LiteRT on it


@slow
@pytest.mark.parametrize("kind", PATHS)
def test_stress_models_three_views(lib, kernel_models, kind):  # noqa: F811
    """tf-keras Dense (asymmetric input, RELU/RELU6, per-channel and per-tensor) and LSTM models on
    random int8 windows with all -128 / all 127 / alternating extremes, every LiteRT path."""
    for name, n in (("dense_pc", 1000), ("dense_pt", 1000), ("lstm_seq", 150), ("lstm_dense", 150)):
        path = kernel_models / f"{name}.tflite"
        model = TFLiteModel.from_file(path)
        ops, tensors = op_io(model)
        caps = capture(path, stress_inputs(model.main.tensors[model.main.inputs[0]].shape[1:], n, len(name)),
                       kind, tensors)
        for op in ops:
            x, litert = caps[op.inputs[0]], caps[op.outputs[0]]
            if op.name == "FULLY_CONNECTED":
                cpp = run_fc(lib, B.pack_fc(P.fully_connected_params(model, op), FC_MODE[kind]), x)
            else:
                cpp = run_lstm(lib, B.pack_op(model, op), x)
            assert rows_differ(cpp, litert) == 0, (name, op.index, kind)


@slow
def test_tied_model_each_path_matches_its_mode(lib, kernel_models):  # noqa: F811
    data = (kernel_models / "dense_lin.tflite").read_bytes()
    fc = TFLiteModel(data).main.ops[0]
    data = patch_scales(data, {fc.inputs[0]: 2.0 ** -6, fc.inputs[1]: 2.0 ** -6, fc.inputs[2]: 2.0 ** -12,
                               fc.outputs[0]: 2.0 ** -3})
    p = P.fully_connected_params(TFLiteModel(data), fc)
    x = stress_inputs((16,), 3000, seed=5)
    for kind in PATHS:
        litert = capture(data, x, kind, [fc.outputs[0]])[fc.outputs[0]]
        wrong = {m: int((run_fc(lib, B.pack_fc(p, m), x) != litert).sum()) for m in FC_MODES}
        assert [m for m, v in wrong.items() if v == 0] == [FC_MODE[kind]], (kind, wrong)


# ---- the HLS testbenches under g++ (C simulation without Vitis) and the library build -------------

def test_testbenches_pass_under_ubsan(tmp_path):
    rng = np.random.default_rng(7)
    src = kernel_sources()
    fcs = [(random_fc(rng, n, m), mode)
           for (n, m), mode in zip([(64, 3), (300, 40), (5, 1)], ("fp32", "ruy-x86", "gemmlowp"))]
    dense = [(B.pack_fc(p, mode), x, R.fully_connected_int8(x, p, mode), s)
             for s, ((p, mode), x) in enumerate(zip(fcs, [saturating(rng, (9, p.n_in)) for p, _ in fcs]))]
    ls = [random_lstm(rng, 24, 16), random_lstm(rng, 3, 5, clip=900)]
    lstm = [(B.pack_lstm(p), x, R.lstm_int8(x[None], p)[0], s) for s, p in enumerate(ls)
            for x in [saturating(rng, (25, p.n_input))]]
    for kind, cases in (("dense_int8", dense), ("lstm_int8", lstm)):
        exe, vec = tmp_path / f"tb_{kind}", write_testbench_vectors(tmp_path / f"tb_{kind}.dat", cases)
        cmd = ["g++", "-O1", "-std=c++14", "-ffp-contract=off", "-Wall", "-Wno-unknown-pragmas", "-Wno-unused-label",
               "-fsanitize=undefined", "-fno-sanitize-recover=all", f"-I{src}", str(src / f"tb_{kind}.cpp"),
               str(src / f"{kind}.cpp"), "-o", str(exe)]
        subprocess.run(cmd, check=True, capture_output=True)
        res = subprocess.run([str(exe), str(vec)], capture_output=True, text=True)
        assert res.returncode == 0 and f"{len(cases)} cases, 0 failed" in res.stdout, res.stdout + res.stderr
        blob, x, y, s = cases[0]
        write_testbench_vectors(vec, [(blob, x, y ^ np.int8(1), s)])     # a wrong expectation fails
        assert subprocess.run([str(exe), str(vec)], capture_output=True).returncode == 1


def test_library_builds_once_and_when_sources_change(tmp_path, monkeypatch):
    src = tmp_path / "src"
    shutil.copytree(kernel_sources(), src)
    KernelLibrary(cache_dir=tmp_path / "cache", sources=src)
    so = tmp_path / "cache" / "libedgehft_kernels.so"
    built = so.stat().st_mtime_ns
    KernelLibrary(cache_dir=tmp_path / "cache", sources=src)
    assert so.stat().st_mtime_ns == built                        # up to date: not rebuilt
    time.sleep(0.01)
    os.utime(src / "int8_ops.h")                                 # a newer source: rebuilt
    KernelLibrary(cache_dir=tmp_path / "cache", sources=src)
    assert so.stat().st_mtime_ns > built
    monkeypatch.setenv("CXX", "no-such-compiler-edgehft")
    os.utime(src / "int8_ops.h")
    with pytest.raises(BoardUnavailableError, match="no C\\+\\+ compiler"):
        KernelLibrary(cache_dir=tmp_path / "cache2", sources=src)
