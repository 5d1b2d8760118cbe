"""`edgehft compile` options that mean what they mean elsewhere (issue 19, CLI): the number of golden vectors is
``--golden-count N`` (``run --golden`` is the flag that checks them); ``--golden N`` is still taken, with a
deprecation warning. The compile itself is replaced by a stand-in that records its options (no TensorFlow)."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from edgehft.cli import main
from tiny_bundle import tiny_tflite


class _Stop(Exception):
    pass


@pytest.fixture
def compiled(monkeypatch, tmp_path):
    """Run `edgehft compile` on a .tflite with extra args; returns (result, the CompileOptions it was given)."""
    import edgehft.compiler.pipeline as pipeline
    seen = []

    def fake(model, calib, out, opts, progress=None):
        seen.append(opts)
        raise _Stop()

    monkeypatch.setattr(pipeline, "compile_model", fake)
    model = tmp_path / "m.tflite"
    model.write_bytes(tiny_tflite())

    def run(*args):
        res = CliRunner().invoke(main, ["compile", str(model), "--out", str(tmp_path / "b"), *args])
        return res, (seen[-1] if seen else None)
    return run


def test_golden_count_sets_the_golden_vectors_without_a_warning(compiled):
    res, opts = compiled("--golden-count", "5")
    assert isinstance(res.exception, _Stop) and opts.golden_count == 5
    assert "deprecated" not in res.output


def test_default_is_16(compiled):
    assert compiled()[1].golden_count == 16


@pytest.mark.parametrize("extra", [[], ["--golden-count", "7"]])
def test_golden_n_is_a_deprecated_alias_that_warns(compiled, extra):
    res, opts = compiled("--golden", "7", *extra)
    assert isinstance(res.exception, _Stop) and opts.golden_count == 7
    assert "compile --golden N is deprecated: use --golden-count 7" in " ".join(res.output.split())


def test_golden_and_golden_count_that_disagree_are_a_usage_error(compiled):
    res, opts = compiled("--golden", "7", "--golden-count", "3")
    assert res.exit_code == 2 and opts is None
    assert "--golden 7 and --golden-count 3 disagree" in res.output


def test_help_shows_golden_count_in_compile_and_the_golden_flag_in_run():
    r = CliRunner()
    compile_help = r.invoke(main, ["compile", "--help"], terminal_width=200).output
    run_help = r.invoke(main, ["run", "--help"], terminal_width=200).output
    assert "--golden-count N" in compile_help
    assert "--golden " not in compile_help.replace("run --golden", "")      # the alias is hidden
    assert "--golden " in run_help and "--golden-count" not in run_help


def test_a_float_plans_last_line_names_the_graph_it_runs_not_model_int8(compiled, tmp_path, monkeypatch):
    """The issue: a float plan's bundle ended with "compiled: model_int8.tflite"."""
    from types import SimpleNamespace

    import edgehft.compiler.pipeline as pipeline
    from edgehft.bundle import load_bundle
    from edgehft.report import Report
    from tiny_bundle import write_tiny_bundle
    (tmp_path / "t").mkdir()
    b = load_bundle(write_tiny_bundle(tmp_path / "t"))
    b.manifest.artifacts = {"int8_ir": "model_int8.tflite"}              # as --quant auto choosing float leaves
    rep = Report(board="cpu", verdict="confirmed", verdict_source="LiteRT", ops=[])
    monkeypatch.setattr(pipeline, "compile_model", lambda *a, **k: SimpleNamespace(bundle=b, report=rep, warnings=[]))
    res, _ = compiled()
    assert res.exit_code == 0, res.output
    last = " ".join(res.output.split()).rsplit("bundle ", 1)[1]
    assert last.endswith("golden vectors; model model.tflite (float), model_int8.tflite (the full-int8 graph, kept "
                         "for reference: not run by this bundle)")
    assert "compiled:" not in res.output


def test_out_onto_a_directory_that_is_no_bundle_is_refused_before_the_compile(monkeypatch, tmp_path):
    """Issue 19 review: --out naming a directory with files but no bundle is refused at once (exit 3), --force or
    not (edgehft never replaces it), not after the whole compile; the files there stay."""
    import edgehft.compiler.pipeline as pipeline
    ran = []
    monkeypatch.setattr(pipeline, "compile_model", lambda *a, **k: ran.append(1))
    model = tmp_path / "m.tflite"
    model.write_bytes(tiny_tflite())
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "notes.txt").write_text("hi")
    for extra in ([], ["--force"]):
        res = CliRunner().invoke(main, ["compile", str(model), "--out", str(junk), *extra])
        assert res.exit_code == 3 and "exists and is not an edgehft bundle" in res.output, res.output
    assert ran == [] and (junk / "notes.txt").read_text() == "hi"
