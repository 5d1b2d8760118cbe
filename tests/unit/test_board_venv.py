"""edgehft.emulate.board_venv: the emulated PYNQ board's venv recipe that ships with the package (issue 18).
Making a venv runs pip (scripts/board-venv.sh does it for the suite, and tests/board runs in what it made);
these check what it would install and how it refuses, without pip."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from edgehft.emulate import board_venv as bv

ROOT = Path(__file__).resolve().parents[2]


def test_the_stacks_are_the_board_files():
    from edgehft.boards import load_board
    from packaging.specifiers import SpecifierSet
    for board, stack in (("pynq-z2", "z2"), ("kv260", "zu"), ("zcu104", "zu"), ("ultra96", "zu")):
        st = load_board(board).stack
        s = bv.STACKS[stack]
        assert s.pynq in SpecifierSet(st.packages["pynq"]), (board, st.packages)
        assert s.interpreter.split("=")[0].split(">")[0] in st.interpreter, (board, st.interpreter)
        if s.python:
            assert s.python + ".0" in SpecifierSet(st.python), (board, st.python)


def test_edgehft_comes_from_this_checkout_or_the_spec():
    assert bv.checkout_root() == ROOT
    assert bv.edgehft_requirement() == ["-e", str(ROOT)]
    assert bv.edgehft_requirement("dist/edgehft-0.3.0-py3-none-linux_x86_64.whl") == [
        "dist/edgehft-0.3.0-py3-none-linux_x86_64.whl"]


def test_box_requirements_leave_out_extras_numpy_and_the_interpreter(monkeypatch):
    reqs = ["numpy>=1.23", "numpy<2; platform_machine == 'armv7l'", "click>=8.1", "rich>=13",
            "ai-edge-litert>=2.0; platform_machine != 'armv7l'", "tflite-runtime>=2.13; python_version < '3.9'",
            "tomli>=1.1; python_version < '3.11'", "onnx>=1.15; extra == \"jetson\""]
    monkeypatch.setattr(bv.metadata, "requires", lambda name: reqs if name == "edgehft" else None)
    assert bv.box_requirements() == ["click>=8.1", "rich>=13", "tomli>=1.1; python_version < '3.11'"]


def test_the_check_names_the_stack():
    assert "import importlib.metadata, numpy, pynq, tflite_runtime, edgehft\n" in bv.check_script(bv.STACKS["z2"])
    code = bv.check_script(bv.STACKS["z2"], pytest=True)
    assert "import importlib.metadata, numpy, pynq, tflite_runtime, edgehft, pytest\n" in code
    assert "pynq.__version__ == '3.1.2'" in code and "numpy.__version__.split('.')[0] == '1'" in code
    compile(code, "check", "exec")


def test_find_python(monkeypatch, tmp_path):
    assert bv.find_python(bv.STACKS["zu"]) == sys.executable
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path))                  # no pyenv 3.10 there
    monkeypatch.setattr(bv.shutil, "which", lambda name: None)
    assert bv.find_python(bv.STACKS["z2"]) is None
    shim = tmp_path / "python3.10"                                    # a pyenv shim of a version not selected
    shim.write_text("#!/bin/sh\nexit 127\n")
    shim.chmod(0o755)
    monkeypatch.setattr(bv.shutil, "which", lambda name: str(shim))
    assert bv.find_python(bv.STACKS["z2"]) is None


def test_no_python_for_the_stack_is_exit_7(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(bv, "find_python", lambda stack: None)
    assert bv.main(["--stack", "z2", str(tmp_path / "v")]) == 7
    assert "no Python 3.10 here for the z2 stack; pass --python PATH" in capsys.readouterr().err
    assert not (tmp_path / "v").exists()
    with pytest.raises(SystemExit) as e:
        bv.main(["--stack", "z3", str(tmp_path / "v")])
    assert e.value.code == 2


def test_a_python_that_is_not_one_or_not_the_stacks_is_exit_7(tmp_path, capsys):
    cases = [("/etc/passwd", "is not a Python 3.8 or later"), (str(tmp_path), "is not a Python"),
             ("/bin/true", "is not a Python 3.8 or later")]
    if sys.version_info[:2] != (3, 10):
        cases.append((sys.executable, "is not a Python 3.10 (it is"))         # z2 wants 3.10
    for python, said in cases:
        assert bv.main(["--stack", "z2" if python == sys.executable else "zu", "--python", python,
                        str(tmp_path / "v")]) == 7
        assert said in capsys.readouterr().err
    assert not (tmp_path / "v").exists()


def test_a_venv_path_that_is_a_file_is_exit_2(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    assert bv.main([str(tmp_path / "f")]) == 2
    assert "exists and is not a directory" in capsys.readouterr().err
