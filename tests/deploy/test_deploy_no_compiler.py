"""``edgehft deploy`` to a box without a compiler (issue 15 item 2), against the loopback sshd box. The box's
Python (``--remote-python``: a script running the board venv's Python with a PATH that holds no C++ compiler
and an empty kernel cache) imports edgehft from its platform wheel, built here. A ``--quant native`` bundle
deploys and its golden vectors are reproduced on the box by the wheel's prebuilt kernel library; the same
box without the prebuilt library is refused at the probe, exit 9, with the reason, and nothing is installed.
"""
from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from deploy_box import box  # noqa: F401 (fixture)
from edgehft.cli import main
from nocompiler_box import box_python, install, native_lstm, platform_wheel  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.slow, pytest.mark.needs("g++", "board-venv")]


def _deploy(box, bundle, python, *more):
    sshd, cfg, root = box
    return CliRunner().invoke(main, ["deploy", str(bundle), "--host", "box", *more, "--ssh-config", str(cfg),
                                     "--remote-python", str(python), "--install-dir", str(root)])


def test_a_native_bundle_deploys_to_a_box_without_a_compiler(box, platform_wheel, native_lstm, tmp_path):
    _, _, root = box
    python = box_python(install(platform_wheel, tmp_path / "site"), tmp_path / "cache", tmp_path / "python")
    res = _deploy(box, native_lstm, python, "--json")
    assert res.exit_code == 0, res.output
    got = json.loads(res.output)["results"][0]
    assert got["golden"]["count"] == got["golden"]["matched"] == 16 and got["golden"]["max_diff"] == 0.0
    assert "edgehft native LSTM" in got["golden"]["path"] and got["forced"] == []
    assert os.readlink(root / "current") == f"versions/{got['version']}"
    assert [p.name for p in (tmp_path / "cache").rglob("*.so")] == []          # nothing was built on the box


def test_a_box_without_the_prebuilt_library_or_a_compiler_is_refused(box, platform_wheel, native_lstm, tmp_path):
    _, _, root = box
    site = install(platform_wheel, tmp_path / "site", prebuilt=False)
    python = box_python(site, tmp_path / "cache", tmp_path / "python")
    res = _deploy(box, native_lstm, python)
    assert res.exit_code == 9, res.output
    flat = " ".join(res.output.split())
    assert ("the box is not a cpu: the box's edgehft has no prebuilt kernel library matching its sources and "
            "cannot build one: no C++ compiler (g++)") in flat
    assert "platform wheel" in flat and "g++ and libhwy-dev on the box" in flat and "Traceback" not in res.output
    assert not (root / "current").exists() and not (root / "versions").exists()
