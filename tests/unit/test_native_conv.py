"""edgehft's native CONV_2D kernel (edgehft/kernels/cpu/cpu_conv.cpp): TFLite CONV_2D semantics with bf16
operands and fp32 sums, on AMX tiles where this machine has them and on every SIMD dispatch target it runs.

The reference is a float64 conv (zero padding as TFLite's SAME/VALID) of the bf16-rounded operands; the
kernel must match it to fp32 summation error, and must *not* match the unrounded operands that closely
(it rounds as documented). No timed assertions.
"""
import numpy as np
import pytest

from edgehft.errors import DTypeError, ShapeError
from edgehft.kernels.cpu import conv as native_conv
from edgehft.kernels.cpu.build import force_target
from edgehft.kernels.cpu.conv import NativeConv2D
from native_reference import bf16, cpu_targets, reference_conv

pytestmark = pytest.mark.needs("g++")

AMX = native_conv.amx_available()
TARGETS = cpu_targets()      # every dispatch target this CPU runs: AMX where it has it, each SIMD target


GEOMETRIES = [   # (H, W, C, Co), (kh, kw), (sh, sw), padding: DeepLOB's convs and others
    ((100, 40, 1, 32), (1, 2), (1, 2), "VALID"),
    ((100, 20, 32, 32), (4, 1), (1, 1), "SAME"),
    ((100, 10, 32, 32), (1, 10), (1, 1), "VALID"),
    ((100, 1, 64, 64), (5, 1), (1, 1), "SAME"),
    ((28, 28, 3, 24), (3, 3), (2, 2), "SAME"),          # image conv: row-by-row tiles, W padding
    ((1, 100, 8, 16), (1, 5), (1, 1), "SAME"),          # a Conv1D as TFLite lowers it
    ((13, 11, 40, 33), (2, 4), (3, 2), "VALID"),        # Co not a multiple of 16, C*kw not of 32
    ((50, 7, 3, 17), (3, 1), (2, 1), "SAME"),
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("geom", GEOMETRIES, ids=lambda g: f"{g[0]}-{g[1]}-{g[2]}-{g[3]}")
def test_conv_matches_float64_on_bf16_operands(geom, target):
    (H, W, C, Co), k, stride, padding = geom
    rng = np.random.default_rng(H * W + C)
    w = rng.standard_normal((Co, *k, C)).astype(np.float32)
    b = rng.standard_normal(Co).astype(np.float32)
    x = rng.standard_normal((1, H, W, C)).astype(np.float32)
    with force_target(target):
        conv = NativeConv2D(w, b, (H, W), C, stride, padding)
    assert conv.isa == target
    y = conv.run(x)[0]
    ref, mag = reference_conv(bf16(x[0]), bf16(w), b, stride, padding)
    assert y.shape == ref.shape
    err = np.abs(y - ref)
    assert (err <= 1e-6 * (mag + np.abs(b))).all(), err.max()
    # the operands really are rounded: the unrounded float64 conv is much farther away
    exact, _ = reference_conv(x[0].astype(np.float64), w.astype(np.float64), b, stride, padding)
    assert np.abs(exact - ref).max() > 20 * err.max()


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("act", ["none", "relu", "relu6", "relu_n1_to_1", "leaky_relu"])
def test_activations_and_no_bias(act, target):
    rng = np.random.default_rng(7)
    w = rng.standard_normal((20, 3, 1, 12)).astype(np.float32)
    x = (3 * rng.standard_normal((1, 30, 4, 12))).astype(np.float32)
    with force_target(target):
        y = NativeConv2D(w, None, (30, 4), 12, (1, 1), "SAME", activation=act, alpha=0.3).run(x)
    ref, mag = reference_conv(bf16(x[0]), bf16(w), None, (1, 1), "SAME", act, 0.3)
    assert (np.abs(y[0] - ref) <= 1e-6 * mag + 1e-7).all()
    if act != "none":
        assert not np.allclose(ref, reference_conv(bf16(x[0]), bf16(w), None, (1, 1), "SAME")[0])


@pytest.mark.skipif(not AMX, reason="this CPU or OS does not run AMX-BF16")
def test_amx_and_portable_paths_agree():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((64, 5, 1, 64)).astype(np.float32)
    x = rng.standard_normal((1, 100, 1, 64)).astype(np.float32)
    a = NativeConv2D(w, None, (100, 1), 64, (1, 1), "SAME").run(x).copy()
    p = NativeConv2D(w, None, (100, 1), 64, (1, 1), "SAME", portable=True).run(x)
    assert np.abs(a - p).max() <= 1e-5 * np.abs(p).max()


@pytest.mark.parametrize("target", TARGETS)
def test_outputs_are_reproducible_and_buffers_reused(target):
    """Every conv of a thread shares one bf16 input buffer: a conv whose padding another conv's input has
    just overwritten (a bigger conv's, all ones) must still read zeros there."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((8, 3, 3, 4)).astype(np.float32)
    with force_target(target):
        conv = NativeConv2D(w, None, (9, 9), 4, (1, 1), "SAME")
        big = NativeConv2D(rng.standard_normal((4, 1, 1, 6)), None, (40, 40), 6)
    x1, x2 = (rng.standard_normal((9, 9, 4)).astype(np.float32) for _ in range(2))
    big.run(np.ones((40, 40, 6), np.float32))
    y1 = conv.run(x1).copy()
    ref, mag = reference_conv(bf16(x1), bf16(w), None, (1, 1), "SAME")
    assert (np.abs(y1[0] - ref) <= 1e-6 * mag + 1e-7).all()
    assert conv.run(x2) is conv.out and not np.array_equal(conv.out, y1)
    big.run(np.ones((40, 40, 6), np.float32))
    assert np.array_equal(conv.run(x1), y1)                 # no state left from the previous calls
    big.run(np.full((40, 40, 6), np.nan, np.float32))       # NaN everywhere the small conv over-reads
    assert np.array_equal(conv.run(x1), y1)


@pytest.mark.parametrize("target", TARGETS)
def test_large_finite_values_saturate_instead_of_becoming_inf(target):
    """bf16's largest finite value is 3.39e38: a larger fp32 input saturates there (the conv stays
    finite, as an fp32 conv would); a NaN input still gives NaN (which may also reach the next pixels'
    outputs through the zero-weight k padding: NaN * 0)."""
    with force_target(target):
        conv = NativeConv2D(np.full((1, 1, 1, 1), 0.5, np.float32), None, (1, 3), 1)
    y = conv.run(np.array([[[[3.4e38], [-3.4e38], [1.0]]]], np.float32))[0, 0, :, 0]
    assert np.isfinite(y).all() and y[0] == pytest.approx(0.5 * 3.3895314e38, rel=1e-6) and y[2] == 0.5
    assert np.isnan(conv.run(np.array([[[[1.0], [np.nan], [1.0]]]], np.float32))[0, 0, 1, 0])


def test_bad_shapes_and_dtypes_are_refused():
    w = np.ones((4, 3, 3, 2), np.float32)
    with pytest.raises(ShapeError, match=r"\(Co, kh, kw, 5\)"):
        NativeConv2D(w, None, (8, 8), 5)
    with pytest.raises(ShapeError, match="bias"):
        NativeConv2D(w, np.ones(3), (8, 8), 2)
    with pytest.raises(ShapeError, match="empty output"):
        NativeConv2D(w, None, (2, 8), 2, padding="VALID")
    with pytest.raises(ShapeError, match="activation"):
        NativeConv2D(w, None, (8, 8), 2, activation="gelu")
    conv = NativeConv2D(w, None, (8, 8), 2, padding="SAME")
    with pytest.raises(ShapeError, match="input shape"):
        conv.run(np.ones((8, 7, 2), np.float32))
    with pytest.raises(DTypeError, match="float32"):
        conv.run(np.ones((8, 8, 2), np.float64))


LINKABLE = [t for t in TARGETS if t in ("amx", "avx3_bf16")]


@pytest.mark.skipif(not LINKABLE, reason="this CPU runs neither AMX-BF16 nor AVX512_BF16 (no bf16 input buffer)")
@pytest.mark.parametrize("target", LINKABLE or ["none"])
def test_linked_convs_give_the_bits_of_convs_run_in_turn(target):
    """Three convs in a row, each reading only the one before (a 1x2 stride-2 VALID, a 4x1 SAME, a 3x3 SAME whose
    input has left/right padding columns; Co 20, not a multiple of 16 or 32): linked, the first reads the fp32
    input and the others their bf16 buffers, the last writes fp32; np.array_equal to running each conv on the
    previous one's output, twice (the buffers' padding stays zero), also with a subnormal and a large value in
    the input. A link to a conv of another input shape, or from a conv off the bf16 paths, is refused."""
    from ctypes import c_void_p
    rng = np.random.default_rng(11)
    with force_target(target):
        a = NativeConv2D(rng.standard_normal((32, 1, 2, 3)), rng.standard_normal(32), (30, 16), 3, (1, 2), "VALID",
                         activation="leaky_relu", alpha=0.01)
        b = NativeConv2D(rng.standard_normal((20, 4, 1, 32)), None, (30, 8), 32, (1, 1), "SAME", activation="relu")
        c = NativeConv2D(rng.standard_normal((8, 3, 3, 20)), rng.standard_normal(8), (30, 8), 20, (1, 1), "SAME")
    out = np.zeros_like(c.out)
    calls = [a.linked_call(None, 0, b), b.linked_call(None, 0, c), c.linked_call(None, out.ctypes.data, None)]
    for trial in range(3):
        x = rng.standard_normal((30, 16, 3)).astype(np.float32)
        if trial == 2:
            x[0, 0, 0], x[5, 3, 1] = 1e-40, 1e30
        want = c.run(b.run(a.run(x)[0]).copy()[0]).copy()
        first = a.linked_call(x.ctypes.data, 0, b)
        assert first() == 0 and calls[1]() == 0 and calls[2]() == 0
        assert np.array_equal(out, want), trial
    with pytest.raises(ShapeError, match="cannot be linked"):
        a.linked_call(None, 0, c)
    with force_target("avx3" if "avx3" in TARGETS else TARGETS[-1]):
        simd = NativeConv2D(rng.standard_normal((20, 4, 1, 32)), None, (30, 8), 32, (1, 1), "SAME")
    assert not simd.linkable
    with pytest.raises(ShapeError, match="cannot be linked"):
        a.linked_call(None, 0, simd)
    assert a._lib.edgehft_conv_run_link(b._h, None, c_void_p(0), simd._h) == -2      # nothing run


class _Step:
    """A stand-in for a chain step's conv (what conv_links reads: linkable, input_shape, out)."""

    def __init__(self, shape_in, shape_out):
        self.linkable, self.input_shape, self.out = True, shape_in, np.zeros((1, *shape_out), np.float32)


def test_conv_links_only_link_a_sole_reader_after_its_sole_writer():
    """conv_links (edgehft.runtime.native_chain): a -> b is linked; a tensor read twice, a chain output, a tensor
    written by two steps (a hostile native.json) or a consumer that runs before its producer are not."""
    from types import SimpleNamespace
    from edgehft.runtime.native_chain import conv_links
    a, b, c = _Step((4, 4, 2), (4, 4, 3)), _Step((4, 4, 3), (4, 4, 3)), _Step((4, 4, 3), (4, 4, 3))

    def chain(steps, outputs=("z",)):
        return SimpleNamespace(steps=[("conv2d", (k, [src], dst, k.out)) for k, src, dst in steps],
                               outputs=list(outputs), inputs=["x"])
    assert conv_links(chain([(a, "x", "t"), (b, "t", "z")])) == {0: 1}
    assert conv_links(chain([(a, "x", "t"), (b, "t", "z"), (c, "t", "w")], ("z", "w"))) == {}     # t read twice
    assert conv_links(chain([(a, "x", "t"), (b, "t", "z")], ("z", "t"))) == {}                   # t an output
    assert conv_links(chain([(a, "x", "t"), (c, "x", "t"), (b, "t", "z")])) == {}                # t written twice
    assert conv_links(chain([(b, "t", "z"), (a, "x", "t")])) == {}                               # read before written
    b.linkable = False
    assert conv_links(chain([(a, "x", "t"), (b, "t", "z")])) == {}


SPLITS = [   # (H, W, C, Co), kernel rows kh, kw, explicit pads (top, bottom, left, right), j0
    ((9, 5, 3, 20), 4, 1, (1, 2, 0, 0), 3),      # DeepLOB's (4, 1) SAME on a slab; odd kw*C; Co not of 16
    ((9, 5, 3, 20), 4, 1, (1, 2, 0, 0), 1),
    ((6, 20, 32, 32), 4, 1, (0, 2, 0, 0), 2),    # a critical run at the window's bottom
    ((8, 1, 64, 64), 5, 1, (2, 2, 0, 0), 4),     # the inception's (5, 1) SAME
    ((7, 10, 32, 32), 1, 10, (0, 0, 0, 0), 1),   # one kernel row: the prefix takes it all for row 0
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("geom", SPLITS, ids=lambda g: f"{g[0]}-{g[1]}x{g[2]}-j{g[4]}")
def test_a_prefix_then_its_suffix_give_the_whole_convs_bits(geom, target):
    (H, W, C, Co), kh, kw, pads, j0 = geom
    rng = np.random.default_rng(kh * 100 + j0)
    w = rng.standard_normal((Co, kh, kw, C)).astype(np.float32)
    b = rng.standard_normal(Co).astype(np.float32)
    x = rng.standard_normal((H, W, C)).astype(np.float32)
    top, bottom = pads[:2]
    with force_target(target):
        whole = NativeConv2D(w, b, (H, W), C, (1, 1), pads, activation="leaky_relu", alpha=0.1)
        if not whole.splittable:
            with pytest.raises(ShapeError, match="AMX"):
                whole.split("prefix", j0)
            whole.close()
            return
        want = whole.run(x).copy()
        Ho, Wo = want.shape[1:3]
        # the prefix: output rows [0, j0) from the input rows they read (the window's edge as padding)
        hi = min(H, j0 - top + kh - 1)
        prefix = NativeConv2D(w, b, (hi, W), C, (1, 1), (top, j0 - top + kh - 1 - hi, *pads[2:]),
                              activation="leaky_relu", alpha=0.1)
        suffix = NativeConv2D(w, b, (H, W), C, (1, 1), pads, activation="leaky_relu", alpha=0.1)
        part = prefix.split("prefix", j0)
        suffix.split("suffix", j0, part)
        part.fill(np.nan)                                  # the suffix reads part at every run, not at split
        prefix.run(x[:hi])
        assert np.isfinite(part).all() and part.shape == (j0 * Wo, -(-Co // 16) * 16)
        got = suffix.run(x)
        assert got.shape == want.shape and np.array_equal(got.view(np.uint32), want.view(np.uint32))
        # the suffix alone (prefix sums of zero) is not the whole conv where the prefix reads input rows (with
        # j0 <= top it reads only the zero padding, which no sum takes)
        part.fill(0.0)
        assert np.array_equal(suffix.run(x)[:, :j0], want[:, :j0]) == (j0 <= top)
        with pytest.raises(ShapeError, match="part must be"):
            suffix.split("suffix", j0, part[:-1])
        for k in (whole, prefix, suffix):
            k.close()
