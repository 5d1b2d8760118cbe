"""Bundle writing/loading rules, windows loading and the CLI's errors and exit codes."""
import json

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import DEEPLOB, FEED_DAY1
from edgehft.bundle import MANIFEST, Manifest, Quantization, SourceModel, TensorSpec, load_bundle, write_bundle
from edgehft.cli import main
from edgehft.errors import BundleError, InputError
from edgehft.windows import load_windows, parse_pipeline, sidecar_pipeline


def _manifest():
    spec = TensorSpec(name="x", index=0, shape=[1, 4], dtype="float32")
    return Manifest(board="cpu", backend="cpu", model_file="model.tflite",
                    source=SourceModel(file="m.keras", sha256="0" * 64, flavour="keras3", lowering="-"),
                    quantization=Quantization(mode="float"), inputs=[spec], outputs=[spec])


def test_write_is_atomic_and_hashes_every_file(tmp_path):
    b = write_bundle(tmp_path / "b", _manifest(), {"model.tflite": b"abc", "extra/x.bin": b"1"}, report={"k": 1})
    assert set(b.manifest.files) == {"model.tflite", "extra/x.bin", "report.json"}
    assert b.manifest.files["model.tflite"] == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert [p.name for p in tmp_path.iterdir()] == ["b"]          # no partial directory left behind
    load_bundle(tmp_path / "b").verify()


def test_refuses_to_replace_a_non_bundle_directory(tmp_path):
    (tmp_path / "keep").mkdir()
    (tmp_path / "keep" / "precious.txt").write_text("mine")
    with pytest.raises(BundleError, match="not an edgehft bundle; refusing"):
        write_bundle(tmp_path / "keep", _manifest(), {"model.tflite": b"abc"})
    assert (tmp_path / "keep" / "precious.txt").read_text() == "mine"


def test_newer_format_and_garbage_manifest(tmp_path):
    write_bundle(tmp_path / "b", _manifest(), {"model.tflite": b"abc"})
    raw = json.loads((tmp_path / "b" / MANIFEST).read_text())
    raw["format_version"] = 99
    (tmp_path / "b" / MANIFEST).write_text(json.dumps(raw))
    with pytest.raises(BundleError, match="format_version 99"):
        load_bundle(tmp_path / "b")
    (tmp_path / "b" / MANIFEST).write_text("{not json")
    with pytest.raises(BundleError, match="not valid JSON"):
        load_bundle(tmp_path / "b")
    with pytest.raises(BundleError, match="no manifest.json"):
        load_bundle(tmp_path)


def test_windows_from_npy_npz_and_errors(tmp_path):
    x = np.ones((5, 3, 2), np.float32)
    np.save(tmp_path / "a.npy", x)
    np.savez(tmp_path / "b.npz", x=x, t_ns=np.arange(5))
    w = load_windows([tmp_path / "a.npy", tmp_path / "b.npz"])
    assert w.x.shape == (10, 3, 2) and w.t_ns is None
    assert load_windows([tmp_path / "b.npz"]).t_ns.tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(InputError, match="raw feed file and the model names no feature pipeline"):
        load_windows([FEED_DAY1])
    np.save(tmp_path / "s.npy", np.ones(3))
    with pytest.raises(InputError, match="non-empty numeric array of windows"):
        load_windows([tmp_path / "s.npy"])
    with pytest.raises(InputError, match="is not 'file.py:function'"):
        parse_pipeline("nocolon")


def test_sidecar_names_the_pipeline():
    p = sidecar_pipeline(DEEPLOB / "deeplob.keras")
    assert p.file == (DEEPLOB / "features.py").resolve() and p.callable == "windows_from_feed"


def test_boards_json_and_unknown_board():
    r = CliRunner()
    res = r.invoke(main, ["boards", "--json"])
    assert res.exit_code == 0
    cpu = next(b for b in json.loads(res.output) if b["name"] == "cpu")
    assert cpu["default_quantization"] == "auto" and cpu["backend"] == "cpu"
    res = r.invoke(main, ["compile", str(DEEPLOB / "deeplob.keras"), "--board", "nope", "--calib",
                          str(FEED_DAY1), "--out", "x"])
    assert res.exit_code == 3 and "unknown board 'nope'" in res.output and "known boards: coral-devboard, coral-m2, coral-pcie, coral-usb, cpu, jetson-agx-orin, jetson-orin-nano, jetson-orin-nx, jetson-xavier-nx, kv260, pynq-z2, ultra96, zcu104" in " ".join(res.output.split())


def test_not_a_bundle_exit_code(tmp_path):
    res = CliRunner().invoke(main, ["run", str(tmp_path), "--golden", "--json"])
    assert res.exit_code == 6
    assert json.loads(res.output)["type"] == "BundleError"


def test_compile_without_calib_is_a_usage_error(tmp_path):
    """A Keras model without --calib: exit 2 (a missing required option, as the README's exit codes say), before
    anything is loaded; the message names the option."""
    res = CliRunner().invoke(main, ["compile", str(DEEPLOB / "deeplob.keras"), "--board", "cpu", "--out",
                                    str(tmp_path / "b")])
    assert res.exit_code == 2 and "Missing option '--calib'" in res.output, res.output
    assert not (tmp_path / "b").exists()


def test_every_command_has_an_example_and_the_top_level_help_lists_exit_codes():
    """Issue 19: ``--help`` of every command shows one or two examples; ``edgehft --help`` lists the exit codes."""
    r = CliRunner()
    top = r.invoke(main, ["--help"], terminal_width=80)
    text = " ".join(top.output.split())
    assert top.exit_code == 0 and "Exit codes (every command): 0 ok," in text and "10 box unreachable" in text
    assert sorted(main.commands) == sorted(main.list_commands(None)) and len(main.commands) >= 11
    for name in main.commands:
        res = r.invoke(main, [name, "--help"], terminal_width=80)
        assert res.exit_code == 0 and "Example" in res.output and f"edgehft {name} " in res.output, (name, res.output)
