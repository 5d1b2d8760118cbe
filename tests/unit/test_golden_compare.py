"""How golden vectors are compared when the box's TFLite interpreter is another release than the one that
made them (issue 18: a PYNQ-Z2 runs tflite-runtime, armv7l has no ai-edge-litert): int8 outputs within 1 LSB,
said so; the same release stays bit-exact; float outputs keep the manifest's atol."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from edgehft.bundle_checks import check_golden, golden_compare, other_interpreter

LITERT = "ai-edge-litert 2.3.0 BUILTIN+XNNPACK"


def test_other_interpreter_is_the_same_kernel_path_of_another_release():
    assert other_interpreter("tflite-runtime 2.14.0 BUILTIN+XNNPACK", LITERT)
    assert other_interpreter("ai-edge-litert 2.1.0 BUILTIN+XNNPACK", LITERT)
    assert not other_interpreter(LITERT, LITERT)                                  # the same release
    assert not other_interpreter("tflite-runtime 2.14.0 BUILTIN_REF", LITERT)     # another kernel path
    assert not other_interpreter("pynq overlay edgehft_pynq_z2 + tflite-runtime 2.14.0", LITERT)
    assert not other_interpreter("tflite-runtime", LITERT)


class _Runner:
    """A runner whose predict_raw returns the golden output plus ``offset`` (int8), on interpreter ``path``."""

    def __init__(self, path: str, offset: int, compare: str = "exact", atol: float = 0.0):
        self.board = "cpu"
        self.path, self.offset = path, offset
        golden = SimpleNamespace(count=4, compare=compare, atol=atol, reference_path=LITERT)
        spec = SimpleNamespace(name="x")
        self.outs = np.arange(4 * 3, dtype=np.int8).reshape(4, 3)
        self.bundle = SimpleNamespace(
            manifest=SimpleNamespace(golden=golden, inputs=[spec], outputs=[SimpleNamespace(name="y")]),
            golden=lambda: ({"x": np.zeros((4, 2), np.int8)}, {"y": self.outs}))
        self.n = 0

    def predict_raw(self, x):
        out = (self.outs[self.n:self.n + 1].astype(np.int16) + self.offset).astype(np.int8)
        self.n += 1
        return out

    def describe(self):
        return {"interpreter": self.path}


@pytest.mark.parametrize("path,offset,ok,lsb", [
    (LITERT, 0, True, 0), (LITERT, 1, False, 0),
    ("tflite-runtime 2.14.0 BUILTIN+XNNPACK", 1, True, 1),
    ("tflite-runtime 2.14.0 BUILTIN+XNNPACK", 2, False, 1),
    ("tflite-runtime 2.14.0 BUILTIN_REF", 1, False, 0)])
def test_exact_vectors_allow_one_lsb_only_on_another_release(path, offset, ok, lsb):
    res = check_golden(_Runner(path, offset))
    assert (res["ok"], res["tolerance_lsb"], res["max_diff"]) == (ok, lsb, float(offset))
    assert res["matched"] == (4 if ok else 0)
    assert golden_compare(res) == ("bit-exact" if not lsb else
                                   "within 1 LSB: another interpreter release than the vectors'")


def test_float_vectors_keep_their_atol():
    res = check_golden(_Runner("tflite-runtime 2.14.0 BUILTIN+XNNPACK", 1, compare="allclose", atol=0.5))
    assert not res["ok"] and res["tolerance_lsb"] == 0 and golden_compare(res) == "within atol 0.5"
