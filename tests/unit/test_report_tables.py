"""Tables at 80 columns (issue 19, CLI): `edgehft boards` and `edgehft report BUNDLE` never cut what a user must
type or read (board names, op names); columns that hold one value on every row go into a note under the table.
The bundle is tests/tiny_bundle.py's (no TensorFlow) with a report.json written here."""
from __future__ import annotations

import re

import pytest
from click.testing import CliRunner
from rich.console import Console
from rich.table import Table

from edgehft.cli import main
from edgehft.report import OpPlacement, Report, fill_table, print_report
from tiny_bundle import write_tiny_bundle

LONG = ("UNIDIRECTIONAL_SEQUENCE_LSTM", "BIDIRECTIONAL_SEQUENCE_LSTM", "EMBEDDING_LOOKUP_SPARSE")


def _op(k: int, name: str, kernel: str, **kw) -> dict:
    return OpPlacement(index=k, op=name, layer=kw.pop("layer", f"layer_with_a_rather_long_name_{k}"),
                       placement=kw.pop("placement", "cpu"), reason_code="XNNPACK", dtype="float32",
                       reason=kw.pop("reason", "delegated to XNNPACK, which takes this op on this host's CPU"),
                       kernel=kernel, **kw).model_dump()


def _cpu_report() -> dict:
    ops = [_op(k, name, kernel) for k, (name, kernel) in
           enumerate(zip(LONG + ("FULLY_CONNECTED",), ("native", "builtin", "XNNPACK", "XNNPACK")))]
    return {"board": "cpu", "verdict": "confirmed", "verdict_source": "LiteRT", "ops": ops}


def _cli(*args) -> str:
    r = CliRunner().invoke(main, list(args), terminal_width=80, env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    assert max(len(line) for line in r.output.splitlines()) <= 80, r.output
    return r.output


def _cells(text: str) -> list[list[str]]:
    """The table rows of ``text`` as their cells, stripped."""
    return [[c.strip() for c in line.strip("│").split("│")] for line in text.splitlines() if line.startswith("│")]


def _row(text: str, first: str) -> list[str]:
    """The cells of the table row whose first cell is ``first``, each with its folded lines joined by a space."""
    rows: list[list[str]] = []
    for cells in _cells(text):
        if cells[0]:
            rows.append(cells)
        elif rows:
            rows[-1] = [f"{a} {b}".strip() for a, b in zip(rows[-1], cells)]
    return next(r for r in rows if r[0] == first)


def test_boards_at_80_columns_show_every_board_name_whole():
    from edgehft.boards import list_boards
    text = _cli("boards")
    names = {b.name for b in list_boards()}
    first = {row[0] for row in _cells(text)} - {""}
    assert first == names                      # every name whole, in its own cell (jetson-orin-nano was cut)
    assert "…" not in text
    assert re.search(r"│ cpu +│ cpu +│ auto, int8, +│ +5000 │", text)    # the budget without ".0"


def test_report_bundle_at_80_columns_keeps_op_names_and_notes_the_constant_columns(tmp_path):
    b = write_tiny_bundle(tmp_path, report=_cpu_report())
    text = _cli("report", str(b))
    rows = [r for r in _cells(text) if r[0].isdigit()]
    assert [r[1] for r in rows] == [*LONG, "FULLY_CONNECTED"]
    assert "every op: dtype float32, placement cpu" in text
    header = next(line for line in text.splitlines() if line.startswith("┃"))
    assert "kernel" in header and "dtype" not in header and "placement" not in header
    assert [r[3] for r in rows] == ["native", "builtin", "XNNPACK", "XNNPACK"]
    assert "as #0" in text                    # a reason given once, then referred to
    assert "…" not in text


def test_vendor_table_at_80_columns_keeps_op_names():
    ops = [_op(k, name, None, placement="accelerator" if k % 2 else "cpu", status="Mapped to Edge TPU" if k % 2
               else "Operation is otherwise supported, but not mapped due to some unspecified limitation",
               reason="not mapped" if k % 2 == 0 else "Mapped to Edge TPU", subgraph=0 if k % 2 else None)
           for k, name in enumerate(LONG)]
    rep = Report(board="coral-usb", verdict="confirmed", verdict_source="edgetpu_compiler", ops=ops)
    con = Console(width=80, record=True)
    print_report(rep, con, "vendor")
    text = con.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    for name in LONG:
        assert re.search(rf"│ +\d+ │ {name} +│", text), name


@pytest.mark.parametrize("rows, dropped", [([["a", "x"]], False), ([["a", "x"], ["b", "x"]], True)])
def test_fill_table_drops_a_constant_column_only_over_two_rows_or_more(rows, dropped):
    t = fill_table(Table(), [("name", {}), ("kind", {})], rows, whole=("name",), constant=("kind",))
    assert [c.header for c in t.columns] == (["name"] if dropped else ["name", "kind"])
    assert t.caption == ("every row: kind x" if dropped else None)


def _gru_report(n_gru: int) -> dict:
    """A cpu report shaped like an unrolled GRU's: ``n_gru`` ops of the layer "gru" (a few kinds, on XNNPACK but
    every tenth on builtin), then the Dense head and a softmax without a layer name."""
    kinds = ("FULLY_CONNECTED", "SPLIT", "LOGISTIC", "MUL", "ADD")
    ops = [_op(k, kinds[k % 5], "builtin" if k % 10 == 9 else "XNNPACK", layer="gru") for k in range(n_gru)]
    ops += [_op(n_gru, "FULLY_CONNECTED", "XNNPACK", layer="probs"),
            _op(n_gru + 1, "SOFTMAX", "builtin", layer=None)]
    return {"board": "cpu", "verdict": "confirmed", "verdict_source": "LiteRT", "ops": ops}


def test_report_of_968_ops_is_one_row_per_layer_and_the_ops_flag_gives_every_op(tmp_path):
    b = write_tiny_bundle(tmp_path, report=_gru_report(966))
    text = _cli("report", str(b))
    assert "968 ops in 3 layers" in text and "op by op: --ops" in " ".join(text.split())
    rows = [r for r in _cells(text) if r[0]]
    assert [r[:3] for r in rows] == [["gru", "966", "#0-965"], ["probs", "1", "#966"], ["(no layer)", "1", "#967"]]
    assert _row(text, "gru")[3:] == ["FULLY_CONNECTED 194, SPLIT 193, LOGISTIC 193, MUL 193, ADD 193",
                                     "XNNPACK 870, builtin 96"]
    assert _row(text, "(no layer)")[3:] == ["SOFTMAX", "builtin"]
    assert "every op: dtype float32" in text
    full = _cli("report", str(b), "--ops")
    numbered = [r for r in _cells(full) if r[0].isdigit()]
    assert [int(r[0]) for r in numbered] == list(range(968))


@pytest.mark.parametrize("n_gru, per_layer", [(58, False), (59, True)])
def test_per_layer_summary_starts_over_60_ops(n_gru, per_layer):
    from edgehft.report import SUMMARY_OVER, ops_table
    rep = Report.model_validate(_gru_report(n_gru))
    assert SUMMARY_OVER == 60 and len(rep.ops) == n_gru + 2
    header = [c.header for c in ops_table(rep).columns]
    assert (header[0] == "layer") is per_layer
    assert [c.header for c in ops_table(rep, full=True).columns][0] == "#"


def test_compile_and_report_help_say_the_threshold():
    for cmd in ("compile", "report"):
        text = CliRunner().invoke(main, [cmd, "--help"], terminal_width=200).output
        assert "--ops" in text and "more than 60 ops shows one row per Keras layer" in text, cmd


_G = {"count": 16, "reference_path": "LiteRT XNNPACK", "reference_kernels_path": "LiteRT BUILTIN_REF"}


@pytest.mark.parametrize("extra, says", [
    ({"max_diff_vs_reference_kernels": 0.0, "windows_differing_from_reference_kernels": 0},
     "vs LiteRT reference kernels: identical on all 16 windows"),
    ({"max_diff_vs_reference_kernels": 1e-5, "windows_differing_from_reference_kernels": 12, "compare": "allclose",
      "atol": 2e-5}, "max diff 1e-05 (raw output units) on 12 of 16 windows: within the golden check's tolerance "
                     "(allclose, atol 2e-05)"),
    ({"max_diff_vs_reference_kernels": 3e-5, "windows_differing_from_reference_kernels": 2, "compare": "allclose",
      "atol": 2e-5}, "on 2 of 16 windows: over the golden check's tolerance (allclose, atol 2e-05)"),
    ({"max_diff_vs_reference_kernels": 3.0, "windows_differing_from_reference_kernels": 5, "compare": "exact",
      "atol": 0.0}, "max diff 3 (raw output units) on 5 of 16 windows: over the golden check's tolerance (exact): the "
                 "golden vectors match only the kernels that made them"),
    ({"max_diff_vs_reference_kernels": 3.0, "windows_differing_from_reference_kernels": 5},
     "on 5 of 16 windows (no tolerance recorded with them)"),
])
def test_golden_line_says_identical_or_whether_the_difference_is_within_tolerance(extra, says):
    from edgehft.report import golden_line
    line = golden_line({**_G, **extra})
    assert line.startswith("golden outputs (LiteRT XNNPACK) vs LiteRT reference kernels") and line.endswith(says)
    assert "0 LSB" not in line


def test_report_of_an_older_bundle_takes_the_tolerance_from_its_manifest(tmp_path):
    golden = {**_G, "max_diff_vs_reference_kernels": 3e-6, "windows_differing_from_reference_kernels": 4}
    b = write_tiny_bundle(tmp_path, report={**_cpu_report(), "golden": golden})     # tiny: allclose, atol 1e-5
    text = " ".join(_cli("report", str(b)).split())
    assert "on 4 of 16 windows: within the golden check's tolerance (allclose, atol 1e-05)" in text


def _plan(select: str, why: str) -> dict:
    row = {"p50_us": 10.0, "p99_us": 20.0, "p99.9_us": 31.5, "p99_over_p50": 2.0, "drift_rel_mae": 0.001,
           "drift_passed": True, "argmax_agreement": 0.99}
    return {"chosen": "native", "why": why, "select": select, "measured_on": {"pinned_cpu": 1, "cpu_model": "x"},
            "measured": [{"plan": "int8", **row, "chosen": False}, {"plan": "native", **row, "chosen": True}]}


@pytest.mark.parametrize("select, why, chosen", [
    ("p99", "lowest p99 of the plans that pass the drift gate, measured on this host", "yes: lowest p99"),
    ("p99.9", "lowest p99.9 of the plans that pass the drift gate, measured on this host", "yes: lowest p99.9"),
    ("p99", "no plan passes the drift gate: the one with the lowest drift", "yes: lowest drift")])
def test_plan_table_says_the_criterion_that_chose_the_plan(select, why, chosen):
    from edgehft.report import plan_table
    con = Console(width=120, record=True)
    con.print(plan_table(_plan(select, why)))
    text = con.export_text()
    native = next(line for line in text.splitlines() if line.startswith("│ native"))
    assert native.rstrip(" │").endswith(chosen)
    assert ("p99.9 µs" in text) is (select == "p99.9") and ("31.5" in native) is (select == "p99.9")


def test_coral_golden_note_says_identical_not_0_lsb():
    from edgehft.compiler.coral import golden_notes
    same = golden_notes({**_G, "max_diff_vs_reference_kernels": 0.0})[0][0]
    apart = golden_notes({**_G, "max_diff_vs_reference_kernels": 2.0})[0][0]
    assert "kernel paths give identical outputs here" in same and "0 LSB" not in same
    assert "differ by up to 2 LSB here" in apart
