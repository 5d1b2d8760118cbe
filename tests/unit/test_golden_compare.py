"""Golden vectors on another TFLite interpreter release than the one that made them (issue 18: a PYNQ-Z2 runs
tflite-runtime, armv7l has no ai-edge-litert): int8 outputs stay bit-exact or fail, and the failure names both
releases and what to do."""
from __future__ import annotations

from edgehft.bundle_checks import golden_compare, golden_mismatch, other_interpreter

LITERT = "ai-edge-litert 2.3.0 BUILTIN+XNNPACK"
TFLRT = "tflite-runtime 2.14.0 BUILTIN+XNNPACK"


def test_other_interpreter_is_the_same_kernel_path_of_another_release():
    assert other_interpreter(TFLRT, LITERT)
    assert other_interpreter("ai-edge-litert 2.1.0 BUILTIN+XNNPACK", LITERT)
    assert not other_interpreter(LITERT, LITERT)                                  # the same release
    assert not other_interpreter("tflite-runtime 2.14.0 BUILTIN_REF", LITERT)     # another kernel path
    assert not other_interpreter("pynq-z2", LITERT)
    assert not other_interpreter("tflite-runtime", LITERT)


def test_the_mismatch_names_both_releases_only_when_they_differ():
    result = {"count": 16, "matched": 9, "max_diff": 11.0, "path": TFLRT, "expected_path": LITERT}
    hint = golden_mismatch(result, "cpu").hint
    assert hint.startswith("this runs tflite-runtime 2.14.0, the golden vectors were made with ai-edge-litert 2.3.0")
    assert "install ai-edge-litert==2.3.0 here" in hint
    same = golden_mismatch({**result, "path": LITERT}, "cpu").hint
    assert same == "the interpreter path differs from the one that made the bundle: " + LITERT
    assert str(golden_mismatch(result, "cpu")) .startswith("7 of 16 golden vectors differ (max diff 11.0)")


def test_compare_in_words():
    assert golden_compare({"compare": "exact"}) == "bit-exact"
    assert golden_compare({"compare": "allclose", "atol": 2e-5}) == "within atol 2e-05"
