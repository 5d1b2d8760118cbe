"""The backend registry (edgehft/backends.py): every stage finds a board's backend by name, and a new board
kind is new files and a board TOML outside edgehft. The ``null`` backend written here at test time (a
package on PYTHONPATH with a ``*.dist-info`` whose entry point is in the group ``edgehft.backends``) compiles,
reports, runs its golden vectors and benches through the real CLI, with no edit to edgehft's files."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import ROOT
from edgehft import backends
from edgehft.boards import list_boards, load_board
from edgehft.bundle_checks import golden_mismatch
from edgehft.deploy.probe import board_mismatches, probe_box
from edgehft.errors import BoardUnavailableError


PLUGIN = {
    "null_board/__init__.py": '''
        """A board-less dry run: the int8 graph on LiteRT on this host, saying NULL."""
        from pathlib import Path

        from edgehft.backends import Backend
        from edgehft.deploy.probe_rules import litert_missing

        BACKEND = Backend(name="null", runtime="null_board.runtime", compiler="null_board.compile:STAGE",
                          probe="null_board:probe", facts="null_board:facts", host_cpu=True,
                          board_dirs=(str(Path(__file__).resolve().parent / "boards"),),
                          golden_hint="NULL runs LiteRT on this host, so the golden path should match: ",
                          partitioner="null_board.partition:PARTITIONER",
                          board_options="null_board.options:OPTIONS")


        def facts(root):
            marker = Path(root) / "etc" / "null-board"
            return {"null_board": marker.read_text().strip() if marker.is_file() else None}


        def probe(board, facts):
            return litert_missing(facts) + ([] if facts.get("null_board") else ["no /etc/null-board: not a NULL box"])
        ''',
    "null_board/options.py": '''
        from edgehft.board_options import BoardOptions, Option

        OPTIONS = BoardOptions(owner="NULL", keys=("null_note",), options=(
            Option(("--null-note",), "null_note", help="NULL boards: a note written into the bundle's manifest."),))
        ''',
    "null_board/runtime.py": '''
        from edgehft.runtime import cpu


        class Runner(cpu.Runner):
            def describe(self):
                d = super().describe()
                d.update(backend="null", device="NULL (no accelerator: the int8 graph on LiteRT, on the host CPU)")
                return d
        ''',
    "null_board/compile.py": '''
        from edgehft.compiler.stage_cpu import CpuStage


        class NullStage(CpuStage):
            def build(self, ctx):
                out = super().build(ctx)
                out.report.notes.append("NULL board: a dry run, no accelerator")
                out.accelerator["device"] = "NULL"
                if "null_note" in ctx.opts.board_options:
                    out.accelerator["note"] = ctx.opts.board_options["null_note"]
                return out


        STAGE = NullStage()
        ''',
    "null_board/partition.py": '''
        from pathlib import Path

        from edgehft.ir import TFLiteModel
        from edgehft.partition.contract import Partitioner
        from edgehft.report import OpPlacement, Report, segments_of


        class NullPartitioner(Partitioner):
            suffixes = (".tflite",)
            default_boards = {".tflite": "null"}     # a built-in's default (coral-usb) comes first
            label = "NULL"
            table = "vendor"
            vendor = "null-litert"

            def predict(self, model, board, **board_options):
                ir = TFLiteModel.from_file(Path(model))
                ops = [OpPlacement(index=op.index, op=op.name, placement="cpu", reason_code="NULL_LITERT",
                                   reason="LiteRT on this host", kernel="LiteRT") for op in ir.main.ops]
                return Report(board=board.name, verdict="predicted", verdict_source="NULL: the int8 graph on LiteRT",
                              ops=ops, counts={"cpu": len(ops)}, segments=segments_of(ops),
                              accelerator={"vendor": "null-litert", "options": sorted(board_options)},
                              notes=[f"NULL dry run of {Path(model).name}: {len(ops)} ops, none on an accelerator"])


        PARTITIONER = NullPartitioner()
        ''',
    "null_board/boards/null.toml": '''
        name = "null"
        backend = "null"
        description = "NULL: no board, the int8 graph on LiteRT on this host (a dry run)"
        quantization = ["int8"]
        default_quantization = "int8"
        io_dtypes = ["int8", "float32"]

        [latency_budget_us]
        p99 = 1000000.0
        ''',
    "null_board-0.1.dist-info/METADATA": '''
        Metadata-Version: 2.1
        Name: null-board
        Version: 0.1
        ''',
    "null_board-0.1.dist-info/entry_points.txt": '''
        [edgehft.backends]
        null = null_board:BACKEND
        ''',
}


@pytest.fixture(scope="module")
def plugin(tmp_path_factory) -> Path:
    """The null backend's site directory (put it on PYTHONPATH / sys.path)."""
    site = tmp_path_factory.mktemp("null_site")
    for rel, text in PLUGIN.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(textwrap.dedent(text).lstrip())
    return site


@pytest.fixture
def on_path(plugin, monkeypatch):
    monkeypatch.syspath_prepend(str(plugin))
    return plugin


def _cli(plugin: Path, *args, timeout=900, env=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin), str(ROOT)]), "TF_CPP_MIN_LOG_LEVEL": "3",
           "CUDA_VISIBLE_DEVICES": "-1", "COLUMNS": "200", **(env or {})}
    return subprocess.run([sys.executable, "-m", "edgehft", *map(str, args)], env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_builtins_are_found_by_name_without_importing_their_stages():
    assert backends.names()[:4] == ["cpu", "coral", "pynq", "jetson"]
    coral = backends.get("coral")
    assert (coral.runtime, coral.compiler, coral.probe) == (
        "edgehft.runtime.coral", "edgehft.compiler.stage_coral:STAGE", "edgehft.deploy.probe_rules.coral:probe")
    assert backends.get("cpu").host_cpu and not coral.host_cpu
    for b in list_boards():             # every shipped board names an installed backend
        assert backends.get(b.backend).name == b.backend
    script = ("import sys; from edgehft import backends, boards; backends.get('jetson'); boards.load_board('kv260');"
              "print(sorted(m for m in sys.modules if m.startswith(('edgehft.runtime', 'edgehft.compiler', "
              "'tensorflow', 'pynq', 'tensorrt'))))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_unknown_backend_is_exit_7_naming_the_installed_ones(tmp_path, monkeypatch):
    with pytest.raises(BoardUnavailableError, match="no backend 'nope' is installed") as exc:
        backends.get("nope")
    assert exc.value.exit_code == 7 and "cpu, coral, pynq, jetson" in exc.value.hint
    from edgehft import boards
    (tmp_path / "ghost.toml").write_text('name = "ghost"\nbackend = "ghost"\nquantization = ["int8"]\n'
                                         'default_quantization = "int8"\n')
    monkeypatch.setattr(boards, "BOARD_DIRS", (tmp_path, *boards.BOARD_DIRS))
    with pytest.raises(BoardUnavailableError, match="no backend 'ghost'"):
        board_mismatches(load_board("ghost"), {"packages": {"ai-edge-litert": "2.3.0"}})


def test_a_broken_entry_point_is_named(tmp_path, monkeypatch):
    info = tmp_path / "broken-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[edgehft.backends]\nbroken = no_such_module_here:BACKEND\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "broken" in backends.names()
    with pytest.raises(BoardUnavailableError, match="backend 'broken' .*failed to load: ModuleNotFoundError"):
        backends.get("broken")
    assert "cpu" in {b.name for b in list_boards()}     # the catalog still lists the others


def test_a_plugin_that_raises_at_import_is_exit_7_and_leaves_the_others_options(tmp_path, monkeypatch):
    """A plugin module that raises (not a missing module: its own bug) is named, exit 7, not a traceback; and
    the other backends keep their board options (Coral's -m still exists)."""
    (tmp_path / "broken_opts").mkdir()
    (tmp_path / "broken_opts" / "__init__.py").write_text(
        "from edgehft.backends import Backend\n"
        "BACKEND = Backend('brokenopts', 'broken_opts.runtime', 'broken_opts:STAGE', 'broken_opts:probe',\n"
        "                  board_options='broken_opts.options:OPTIONS')\n")
    (tmp_path / "broken_opts" / "options.py").write_text("raise RuntimeError('a bug in the plugin')\n")
    info = tmp_path / "broken_opts-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-opts\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[edgehft.backends]\nbrokenopts = broken_opts:BACKEND\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(BoardUnavailableError, match="importing broken_opts.options failed: RuntimeError: a bug") as e:
        backends.get("brokenopts").load("board_options")
    assert e.value.exit_code == 7
    assert [name for name, _ in backends.stage_of_each("board_options")] == ["coral"]
    h = _cli(tmp_path, "compile", "--help")
    assert h.returncode == 0 and "--min-runtime" in h.stdout and "Traceback" not in h.stderr


def test_a_plugin_option_cannot_shadow_edgehfts_or_an_earlier_backends(tmp_path):
    """A plugin declaring --timeout (compile's own) and -m (Coral's) gets both dropped, each with a warning
    naming it; its option that clashes with nothing is there, and edgehft's own keep their meaning."""
    (tmp_path / "clash_opts").mkdir()
    (tmp_path / "clash_opts" / "__init__.py").write_text(
        "from edgehft.backends import Backend\n"
        "from edgehft.board_options import BoardOptions, Option\n"
        "BACKEND = Backend('clash', 'clash_opts.runtime', 'clash_opts:STAGE', 'clash_opts:probe',\n"
        "                  board_options='clash_opts:OPTIONS')\n"
        "OPTIONS = BoardOptions(owner='CLASH', keys=('t', 'm', 'ok'), options=(\n"
        "    Option(('--timeout',), 't', help='shadows compile --timeout'),\n"
        "    Option(('--my-runtime', '-m'), 'm', help='shadows Coral -m'),\n"
        "    Option(('--clash-ok',), 'ok', help='CLASH boards: a fine option')))\n")
    info = tmp_path / "clash_opts-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: clash-opts\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[edgehft.backends]\nclash = clash_opts:BACKEND\n")
    h = _cli(tmp_path, "compile", "--help")
    assert h.returncode == 0, h.stderr
    said = " ".join(h.stderr.split())
    assert "backend 'clash''s option --timeout clashes with another option of `edgehft compile`" in said
    assert "backend 'clash''s option --my-runtime/-m clashes" in said
    assert "--clash-ok" in h.stdout and "--my-runtime" not in h.stdout
    assert "Converter time limit" in h.stdout and "edgetpu_compiler -m" in h.stdout     # edgehft's and Coral's


def test_the_null_plugin_is_found_through_its_entry_point(on_path):
    assert "null" in backends.names()
    b = backends.get("null")
    assert b.runtime == "null_board.runtime" and b.host_cpu
    board = load_board("null")
    assert board.backend == "null" and Path(board.path).parent == on_path / "null_board" / "boards"
    assert "null" in {x.name for x in list_boards()}
    litert = {"packages": {"ai-edge-litert": "2.3.0"}, "bundle_format_version": 1, "null_board": "yes"}
    assert board_mismatches(board, litert) == []
    assert board_mismatches(board, {**litert, "packages": {}, "null_board": None}) == [
        "no LiteRT interpreter on the box (pip install ai-edge-litert, or tflite-runtime)",
        "no /etc/null-board: not a NULL box"]
    assert "reads bundle format 0" in board_mismatches(board, {**litert, "bundle_format_version": 0})[0]


def test_the_box_probe_reads_each_backends_facts(on_path, tmp_path):
    """probe_box gathers the plugin's facts with the built-ins'; a plugin whose facts raise is named, not fatal."""
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "null-board").write_text("rev 2\n")
    (tmp_path / "etc" / "environment").write_text("BOARD=Pynq-Z2\n")
    f = probe_box(tmp_path)
    assert (f["null_board"], f["pynq_board"], f["l4t"], f["edgetpu"]) == ("rev 2", "Pynq-Z2", None, {"usb": 0, "pci": 0})
    assert "facts_errors" not in f
    assert probe_box(tmp_path / "nothing")["null_board"] is None
    import null_board
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(null_board, "facts", lambda root: 1 / 0)
        f = probe_box(tmp_path)
    assert f["facts_errors"] == {"null": "ZeroDivisionError: division by zero"} and f["pynq_board"] == "Pynq-Z2"


def test_the_golden_mismatch_hint_is_the_backends(on_path):
    result = {"count": 16, "matched": 15, "max_diff": 1.0, "expected_path": "LiteRT 2.3.0 XNNPACK"}
    err = golden_mismatch(result, "null")
    assert err.exit_code == 8 and str(err.args[0]) == "1 of 16 golden vectors differ (max diff 1.0)"
    assert err.hint == "NULL runs LiteRT on this host, so the golden path should match: LiteRT 2.3.0 XNNPACK"
    assert golden_mismatch(result, "pynq").hint.startswith("the overlay's kernels or the bundle's FPGA weights")
    for name in ("cpu", "", "not-installed"):
        assert golden_mismatch(result, name).hint == ("the interpreter path differs from the one that made the "
                                                      "bundle: LiteRT 2.3.0 XNNPACK")


def test_partitioners_are_registered_by_path_and_give_the_cli_defaults_as_data(on_path):
    """Each built-in names its partitioner by module path (imported only when asked); the CLI's default boards
    per model suffix are the partitioners' data, the built-ins' first; the null plugin's partitioner is found."""
    assert [backends.get(n).partitioner for n in ("cpu", "coral", "pynq", "jetson")] == [
        "", "edgehft.partition.coral:PARTITIONER", "edgehft.partition.pynq:PARTITIONER",
        "edgehft.partition.jetson:PARTITIONER"]
    script = ("import sys; from edgehft import backends; backends.get('coral'); backends.get('jetson');"
              "print(sorted(m for m in sys.modules if m.startswith('edgehft.partition')))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"
    assert (backends.default_board(".tflite"), backends.default_board(".onnx"), backends.default_board(".x")) == (
        "coral-usb", "jetson-agx-orin", None)
    assert backends.predicting(".tflite") == ["coral", "pynq", "null"] and backends.predicting(".onnx") == ["jetson"]
    assert backends.partitioner("null").label == "NULL"
    cpu = backends.partitioner("cpu")
    assert (cpu.suffixes, cpu.table, cpu.takes_engine_records) == ((), "", False)
    assert [backends.partitioner(n).takes_engine_records for n in ("coral", "pynq", "jetson")] == [False, False, True]


def test_the_report_table_is_the_partitioners(on_path):
    """print_report lays a report out as its backend's partitioner says: by the layout named, else by the
    partitioner that declares the report's vendor tag (the plugin's too), else from the report's own fields."""
    from edgehft.report import OpPlacement, Report, ops_table, table_layout
    op = OpPlacement(index=0, op="ADD", placement="cpu", reason_code="X", reason="r", kernel="k")
    plain = Report(board="b", verdict="predicted", verdict_source="s", ops=[op])
    assert table_layout(plain) == "kernels"
    assert table_layout(plain.model_copy(update={"accelerator": {"vendor": "nvidia-tensorrt"}})) == "engine"
    assert table_layout(plain.model_copy(update={"accelerator": {"vendor": "null-litert"}})) == "vendor"
    assert table_layout(plain.model_copy(update={"ops": [op.model_copy(update={"status": "s"})]})) == "vendor"
    columns = {k: [c.header for c in ops_table(plain, k).columns] for k in ("kernels", "vendor", "engine")}
    assert columns["kernels"] == ["#", "op", "layer", "dtype", "placement", "kernel", "reason"]
    assert columns["vendor"] == ["#", "op / layer", "placement", "status", "why, fix"]
    assert columns["engine"] == ["#", "ONNX node", "predicted", "confirmed", "status", "engine layer / why"]
    assert [c.header for c in ops_table(plain, "no-such-layout").columns] == columns["kernels"]


def test_the_first_open_isolates_what_the_backend_declares(on_path):
    """The built-ins' declarations; a backend that declares nothing is isolated like cpu when its Runner
    subclasses the cpu board's (the null plugin), and not otherwise."""
    from edgehft.runtime.isolate import isolated
    assert [isolated(backends.get(n)) for n in ("cpu", "coral", "pynq", "jetson")] == [
        ("runner",), ("emulated",), ("emulated", "cpu_steps"), ()]
    assert backends.get("null").isolate is None and isolated(backends.get("null")) == ("runner",)
    other = backends.Backend("other", "edgehft.runtime.base", "x:y", "x:z")
    assert isolated(other) == ()
    assert isolated(backends.Backend("other", "edgehft.runtime.base", "x:y", "x:z", isolate=("runner",))) == ("runner",)


@pytest.fixture(scope="module")
def null_bundle(plugin, mlp, tmp_path_factory) -> tuple:
    """The mlp compiled for the null board through the CLI: (bundle, the compile's CompletedProcess)."""
    bundle = tmp_path_factory.mktemp("null_bundle") / "mlp.null"
    c = _cli(plugin, "compile", mlp / "mlp.keras", "--board", "null", "--calib", mlp / "x.npy", "--out", bundle,
             "--null-note", "dry run of the mlp", "--json")
    return bundle, c


def test_null_board_reports_a_tflite_through_its_own_partitioner(plugin, null_bundle):
    bundle, c = null_bundle
    assert c.returncode == 0, c.stderr
    model = bundle / json.loads((bundle / "manifest.json").read_text())["model_file"]
    r = _cli(plugin, "report", model, "--board", "null", "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["model"] == str(model)
    rep = rep["report"]
    assert (rep["board"], rep["verdict"], rep["verdict_source"]) == ("null", "predicted", "NULL: the int8 graph on LiteRT")
    assert rep["accelerator"] == {"vendor": "null-litert", "options": []}       # no board options given
    # the plugin's own option reaches its partitioner; another board kind's is refused, as compile refuses it
    r = _cli(plugin, "report", model, "--board", "null", "--null-note", "x", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["report"]["accelerator"]["options"] == ["null_note"]
    r = _cli(plugin, "report", model, "--board", "null", "-m", "13", "--json")     # --json: the error as JSON
    assert r.returncode == 3 and json.loads(r.stdout)["error"] == "-m/-a/-i/--edgetpu-model apply to Coral boards, not null"
    r = _cli(plugin, "report", model, "--board", "coral-usb", "--null-note", "x")
    assert r.returncode == 3 and "--null-note applies to NULL boards, not coral-usb" in " ".join(r.stderr.split())
    assert {o["reason_code"] for o in rep["ops"]} == {"NULL_LITERT"} and rep["counts"] == {"cpu": len(rep["ops"])}
    t = _cli(plugin, "report", model, "--board", "null")
    assert t.returncode == 0, t.stderr
    text = " ".join(t.stdout.split())
    assert "null: " in text and "placement predicted (NULL: the int8 graph on LiteRT)" in text
    assert "why, fix" in text and f"NULL dry run of {model.name}: {len(rep['ops'])} ops" in text   # its table
    wrong = _cli(plugin, "report", model, "--board", "cpu")
    assert wrong.returncode == 3
    assert "available for Coral boards and PYNQ boards and NULL boards, not cpu" in " ".join(wrong.stderr.split())
    rec = _cli(plugin, "report", bundle, "--engine-record", model)
    assert rec.returncode == 2 and "--engine-record applies to a Jetson bundle" in rec.stderr
    be = _cli(plugin, "build-engine", bundle)
    assert be.returncode == 3 and "not a Jetson board" in be.stderr


def test_null_board_first_open_is_isolated(plugin, null_bundle, tmp_path):
    """The plugin declares no isolation, its Runner subclasses cpu's: `run` opens the bundle first in a child
    (through the plugin's own runtime module) and remembers it, as for the cpu board."""
    bundle, c = null_bundle
    assert c.returncode == 0, c.stderr
    cache = tmp_path / "cache"
    env = {"EDGEHFT_CACHE": str(cache)}
    for _ in range(2):
        g = _cli(plugin, "run", bundle, "--golden", "--json", env=env)
        assert g.returncode == 0, g.stderr
        assert json.loads(g.stdout)["ok"] is True
    markers = list((cache / "opened").iterdir())
    assert len(markers) == 1                      # one child, once: the second run found the marker
    assert json.loads(markers[0].read_text())["bundle"] == str(bundle)


def test_null_board_compiles_reports_runs_and_benches_through_the_cli(plugin, mlp, null_bundle):
    bundle, c = null_bundle
    assert c.returncode == 0, c.stderr
    res = json.loads(c.stdout)
    assert res["report"]["board"] == "null" and "NULL board: a dry run, no accelerator" in res["report"]["notes"]
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert (manifest["board"], manifest["backend"], manifest["accelerator"]) == (
        "null", "null", {"device": "NULL", "note": "dry run of the mlp"})      # its own --null-note
    help_text = _cli(plugin, "compile", "--help").stdout
    assert "--null-note" in help_text and "--min-runtime" in help_text
    cpu = _cli(plugin, "compile", mlp / "mlp.keras", "--board", "cpu", "--calib", mlp / "x.npy", "--out",
               bundle.parent / "never", "--null-note", "x")
    assert cpu.returncode == 3 and "--null-note applies to NULL boards, not cpu" in " ".join(cpu.stderr.split())
    assert not (bundle.parent / "never").exists()
    assert manifest["quantization"]["mode"] == "int8" and manifest["golden"]["compare"] == "exact"

    r = _cli(plugin, "report", bundle)
    assert r.returncode == 0, r.stderr
    assert "null" in r.stdout and "NULL board: a dry run" in r.stdout

    g = _cli(plugin, "run", bundle, "--golden", "--json")
    assert g.returncode == 0, g.stderr
    gold = json.loads(g.stdout)
    assert (gold["board"], gold["ok"], gold["matched"]) == ("null", True, manifest["golden"]["count"])
    assert gold["count"] == 16 and gold["max_diff"] == 0.0

    b = _cli(plugin, "bench", bundle, "--ticks", mlp / "x.npy", "--samples", 20, "--warmup", 5, "--json")
    assert b.returncode == 0, b.stderr
    bench = json.loads(b.stdout)
    assert bench["runner"]["board"] == "null" and bench["runner"]["backend"] == "null"
    assert bench["runner"]["device"].startswith("NULL") and bench["samples"] == 20
    assert bench["budget_us"] == {"p99": 1000000.0}

    t = _cli(plugin, "bench", bundle, "--ticks", mlp / "x.npy", "--samples", 20, "--warmup", 5)
    assert t.returncode == 0 and "board budget (null)" in t.stdout

    boards = _cli(plugin, "boards")
    assert boards.returncode == 0 and "null" in boards.stdout


def test_without_the_plugin_the_null_board_is_unknown(plugin, mlp, tmp_path):
    """The same CLI without the plugin on PYTHONPATH: the null board is unknown (exit 3, naming it)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "edgehft", "compile", mlp / "mlp.keras", "--board", "null", "--calib",
                        mlp / "x.npy", "--out", tmp_path / "b"], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 3 and "unknown board 'null'" in r.stderr


def test_without_the_plugin_its_bundle_still_reports(plugin, null_bundle):
    """`report BUNDLE` of a backend that is not installed shows the bundle's report as it is (no partitioner to
    ask); build-engine refuses it as any non-Jetson bundle (exit 3), not as an unknown backend."""
    bundle, c = null_bundle
    assert c.returncode == 0, c.stderr
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    r = subprocess.run([sys.executable, "-m", "edgehft", "report", bundle], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "NULL board: a dry run" in r.stdout and "kernel" in r.stdout
    be = subprocess.run([sys.executable, "-m", "edgehft", "build-engine", bundle], env=env, capture_output=True,
                        text=True, timeout=120)
    assert be.returncode == 3 and "is for null (null), not a Jetson board" in " ".join(be.stderr.split())


DISPATCH = ("runtime/__init__.py", "runtime/base.py", "runtime/litert.py", "runtime/isolate.py", "runtime/plans.py",
            "boards.py", "bundle.py", "bundle_checks.py", "board_options.py", "windows.py", "signing.py", "report.py",
            "compiler/pipeline.py", "compiler/stage.py", "compiler/golden.py", "compiler/drift.py",
            "compiler/worker.py", "compiler/isolate.py",
            "cli/__init__.py", "cli/common.py", "cli/compile.py", "cli/run.py", "cli/inspect.py", "cli/deploy.py",
            "cli/sign.py", "bench/replay.py", "bench/profile.py", "bench/fingerprint.py",
            "hil/checks.py", "hil/plugin.py", "hil/target.py", "hil/options.py", "hil/summary.py",
            "deploy/deploy.py", "deploy/agent.py", "deploy/store.py", "deploy/remote.py", "deploy/probe.py",
            "deploy/ssh.py", "deploy/inventory.py")
KINDS = {"cpu", "coral", "pynq", "jetson", "edgetpu"}


def _kind_comparisons(path: Path) -> list[str]:
    import ast
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            for sub in ast.walk(node):
                if isinstance(sub, ast.Constant) and sub.value in KINDS:
                    found.append(f"{path.name}:{node.lineno} compares with {sub.value!r}")
        looked_up = (node.slice if isinstance(node, ast.Subscript) else
                     node.args[0] if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                     and node.func.attr == "get" and node.args else None)
        if isinstance(looked_up, ast.Constant) and looked_up.value in KINDS:   # facts["edgetpu"], f.get("pynq")
            found.append(f"{path.name}:{node.lineno} looks up {looked_up.value!r}")
    return found


@pytest.mark.parametrize("rel", DISPATCH)
def test_dispatch_names_no_board_kind(rel):
    """runtime.open, the board catalog, the deploy probe, compile_model, the golden check, `edgehft report`
    and build-engine, the report's table choice and the isolated first open decide nothing by comparing with
    a board kind's name: they ask the backend (edgehft.backends)."""
    assert _kind_comparisons(ROOT / "edgehft" / rel) == []


def test_the_dispatch_check_finds_a_comparison(tmp_path):
    (tmp_path / "x.py").write_text('if board.backend == "pynq" or kind in ("jetson",):\n    pass\n')
    assert _kind_comparisons(tmp_path / "x.py") == ["x.py:1 compares with 'pynq'", "x.py:1 compares with 'jetson'"]
    (tmp_path / "y.py").write_text("n = facts['edgetpu']\nm = f.get('pynq', {})\nok = f.get(name)\n")
    assert _kind_comparisons(tmp_path / "y.py") == ["y.py:1 looks up 'edgetpu'", "y.py:2 looks up 'pynq'"]
