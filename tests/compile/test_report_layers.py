"""The op report of a large model (issue 19, CLI): a GRU with ``unroll=True`` (tests/make_models.py, 20 steps)
lowers to some 300 TFLite ops; `edgehft compile` and `edgehft report` show them per Keras layer at 80 columns,
and op by op with ``--ops``; the golden line says whether the reference kernels' difference is within the
golden check's tolerance, and the last line names the graph the bundle runs."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from edgehft.cli import main

pytestmark = pytest.mark.slow


def _table_rows(text: str) -> list[list[str]]:
    """Each row's cells of the first table in ``text``, a row folded over several lines joined into one."""
    rows: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith("└"):
            break
        if not line.startswith("│"):
            continue
        cells = [c.strip() for c in line.strip("│").split("│")]
        if cells[0] or not rows:
            rows.append(cells)
        else:
            rows[-1] = [f"{a} {b}".strip() for a, b in zip(rows[-1], cells)]
    return rows


def _cli(*args) -> str:
    r = CliRunner().invoke(main, [str(a) for a in args], terminal_width=80, env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    assert max(len(line) for line in r.output.splitlines()) <= 80, r.output
    return r.output


def test_unrolled_gru_is_reported_per_layer_and_op_by_op_on_request(models, tmp_path):
    out = tmp_path / "gru.cpu"
    text = _cli("compile", models / "k3_gru_unrolled.keras", "--board", "cpu", "--quant", "float", "--calib",
                models / "calib.npy", "--out", out, "--calib-windows", 16, "--drift-windows", 16)
    ops = json.loads((out / "report.json").read_text())["ops"]
    assert len(ops) > 200
    layers: dict[str, list[int]] = {}
    for op in ops:
        layers.setdefault(op["layer"] or "(no layer)", []).append(op["index"])
    gru = layers["gru"]
    assert len(gru) > 200 and gru == list(range(gru[0], gru[-1] + 1))    # the unrolled steps, one run of ops
    for shown in (text, _cli("report", out)):
        assert f"{len(ops)} ops in {len(layers)} layers" in shown
        rows = _table_rows(shown)
        assert [r[0] for r in rows] == list(layers)
        assert rows[list(layers).index("gru")][1:3] == [str(len(gru)), f"#{gru[0]}-{gru[-1]}"]
    g = json.loads((out / "report.json").read_text())["golden"]
    m = json.loads((out / "manifest.json").read_text())["golden"]
    assert (g["compare"], g["atol"]) == (m["compare"], m["atol"]) == ("allclose", m["atol"])    # kept in the report
    said = " ".join(text.split())
    assert ("identical on all 16 windows" if g["max_diff_vs_reference_kernels"] == 0 else
            f"within the golden check's tolerance (allclose, atol {m['atol']:g})") in said
    assert said.endswith("golden vectors; model model.tflite (float)")
    full = _table_rows(_cli("report", out, "--ops"))
    assert [int(r[0]) for r in full] == [op["index"] for op in ops]
    assert {r[1] for r in full} == {op["op"] for op in ops}
