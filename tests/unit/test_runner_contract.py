"""The Runner contract a backend implements (edgehft/runtime/base.py): what ``bench --profile`` asks of it is a
public method with a clear answer when a runner has nothing to profile, and every built-in runner answers it."""
from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest

from edgehft.errors import BoardUnavailableError
from edgehft.runtime import base, cpu, pynq


def test_the_base_runner_says_it_has_no_profile():
    with pytest.raises(BoardUnavailableError, match="board nullish's runner has no per-op profile") as e:
        base.Runner.profile_target(SimpleNamespace(board="nullish"))
    assert e.value.exit_code == 7 and e.value.hint == "bench it without --profile"


@pytest.mark.parametrize("module", [cpu, pynq])
def test_builtin_runners_answer_the_profile_contract(module):
    assert module.Runner.profile_target is not base.Runner.profile_target
    assert list(inspect.signature(module.Runner.profile_target).parameters) == ["self"]


def test_a_whole_model_cpu_runner_profiles_its_model_file():
    fake = SimpleNamespace(_steps=None, _loaded_model_file=lambda: "m.tflite")
    assert cpu.Runner.profile_target(fake) == {"model_file": "m.tflite"}
