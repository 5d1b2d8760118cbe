"""No code runs from a bundle unless the user asks for it: the feature pipeline a bundle carries runs only
with --run-features (run, bench) or run_features (the HIL checks), only from a verified file inside the
bundle, and the checks never read paths the manifest names. Each bundle here has a pipeline that would
leave a canary file behind if it ever ran."""
import json
import os
import re
import shutil

import pytest
from click.testing import CliRunner

from conftest import FEED_DAY1
from edgehft import runtime
from edgehft.bundle import MANIFEST, sha256_file
from edgehft.cli import main
from edgehft.hil import checks as hil_checks

pytestmark = pytest.mark.slow

CANARY_CODE = """
import pathlib
pathlib.Path({canary!r}).write_text("ran")

def windows_from_feed(paths, labels=False):
    raise RuntimeError("the canary pipeline only imports")
"""


def rehash(bundle, mutate_manifest=None):
    """Re-hash every listed file (so the bundle verifies), then let ``mutate_manifest(dict)`` edit it."""
    m = json.loads((bundle / MANIFEST).read_text())
    m["files"] = {rel: sha256_file(bundle / rel) for rel in m["files"] if (bundle / rel).is_file()}
    if mutate_manifest:
        mutate_manifest(m)
    (bundle / MANIFEST).write_text(json.dumps(m, indent=1))
    return bundle


@pytest.fixture
def canary(tmp_path):
    return tmp_path / "CANARY"


@pytest.fixture
def armed(deeplob_bundle, tmp_path, canary):
    """The DeepLOB bundle with a pipeline that writes ``canary`` when imported (manifest re-hashed)."""
    b = tmp_path / "armed.cpu"
    shutil.copytree(deeplob_bundle, b)
    (b / "features" / "features.py").write_text(CANARY_CODE.format(canary=str(canary)))
    return rehash(b)


class Result:
    """A CLI run: ``exit_code``, and ``output`` with rich's line wrapping undone."""

    def __init__(self, res):
        self.exit_code, self.output = res.exit_code, " ".join(res.output.split())


def invoke(*args):
    return Result(CliRunner().invoke(main, [str(a) for a in args]))


def test_raw_feed_without_the_flag_runs_nothing(armed, canary):
    for cmd in (["run", armed, "--ticks", FEED_DAY1], ["bench", armed, "--ticks", FEED_DAY1, "--samples", "5"],
                ["bench", armed, "--profile", "--ticks", FEED_DAY1, "--samples", "2"]):
        res = invoke(*cmd)
        assert res.exit_code == 3, res.output
        assert "is a raw feed" in res.output and "--run-features" in res.output
        assert "Traceback" not in res.output
    assert not canary.exists()
    res = invoke("run", armed, "--golden")            # golden vectors need no code from the bundle
    assert res.exit_code == 0 and not canary.exists()


def test_the_flag_runs_exactly_the_hashed_file(armed, canary):
    res = invoke("run", armed, "--run-features", "--ticks", FEED_DAY1)
    assert canary.read_text() == "ran"                # asked for: the bundle's own file ran
    assert res.exit_code == 3 and "the canary pipeline only imports" in res.output


def test_hil_checks_never_read_the_manifests_paths(armed, canary, tmp_path):
    """The manifest names a calibration feed that exists here (and /etc/hostname): the latency and soak
    checks replay the golden inputs and import nothing."""
    rehash(armed, lambda m: m["quantization"].update(calibration_source=[str(FEED_DAY1), "/etc/hostname"]))
    with runtime.open(armed) as r:
        lat = hil_checks.latency(r, samples=5, warmup=0, budget_p99=1e9, budget_p999=1e9)
        soak = hil_checks.soak(r, minutes=0.002, intervals=2, warmup=0, max_p99_drift=1e9,
                               max_rss_growth_mb=1e6)
        assert lat["source"]["kind"] == soak["source"]["kind"] == "golden"
        with pytest.raises(Exception, match="--run-features"):
            hil_checks.latency(r, ticks=[str(FEED_DAY1)], samples=5, warmup=0)
    assert not canary.exists()


def _point_features(where):
    return lambda m: m["features"].update(file=where)


@pytest.mark.parametrize("name,edit,message", [
    # the bundle loader refuses such paths for every file (edgehft.bundle), the pipeline loader again
    ("absolute", lambda b, c: _point_features(str(b.parent / "evil.py")), "absolute path|not a relative .py path"),
    ("dotdot", lambda b, c: _point_features("../evil.py"), r"'\.\.'|\.\./|not a relative .py path"),
    ("unlisted", lambda b, c: _point_features("features/other.py"), "not listed"),
    ("module", lambda b, c: (lambda m: m["features"].update(file="", callable="this:x")), "module reference"),
    ("callable", lambda b, c: (lambda m: m["features"].update(callable="os.system")), "not a function name"),
])
def test_a_pipeline_outside_the_verified_bundle_is_refused(armed, canary, tmp_path, name, edit, message):
    evil = CANARY_CODE.format(canary=str(canary))
    (armed.parent / "evil.py").write_text(evil)
    (armed / "features" / "other.py").write_text(evil)
    rehash(armed, edit(armed, canary))
    if name == "unlisted":                   # other.py is in the directory but the manifest does not list it
        m = json.loads((armed / MANIFEST).read_text())
        m["files"].pop("features/other.py", None)
        (armed / MANIFEST).write_text(json.dumps(m, indent=1))
    res = invoke("run", armed, "--run-features", "--ticks", FEED_DAY1)
    assert res.exit_code == 6, res.output
    assert re.search(message, res.output) and "Traceback" not in res.output
    assert "Beautiful is better than ugly" not in res.output          # `import this` never ran
    assert not canary.exists()


def test_a_symlinked_pipeline_is_refused(armed, canary, tmp_path):
    outside = tmp_path / "outside.py"
    outside.write_text(CANARY_CODE.format(canary=str(canary)))
    target = armed / "features" / "features.py"
    target.unlink()
    os.symlink(outside, target)
    rehash(armed)
    res = invoke("run", armed, "--run-features", "--ticks", FEED_DAY1)
    assert res.exit_code == 6, res.output
    assert "symlink" in res.output and not canary.exists()


@pytest.mark.parametrize("file,fn,message", [
    ("/etc/evil.py", "f", "not a relative .py path"), ("../evil.py", "f", "not a relative .py path"),
    ("features/../../evil.py", "f", "not a relative .py path"), ("features\\\\evil.py", "f", "not a relative"),
    ("features/features.txt", "f", "not a relative .py path"), ("features/other.py", "f", "not listed"),
    ("", "this:x", "module reference"), ("features/features.py", "os.system", "not a function name"),
    ("features/features.py", "import", "not a function name")])
def test_the_pipeline_loader_refuses_on_its_own(armed, canary, file, fn, message):
    """:func:`bundle_pipeline` holds the line even where a manifest got past the bundle loader."""
    from edgehft.bundle import Features, load_bundle
    from edgehft.bundle_checks import bundle_pipeline
    from edgehft.errors import BundleError
    b = load_bundle(armed)
    b.manifest.features = Features(file=file, callable=fn)
    with pytest.raises(BundleError, match=message):
        bundle_pipeline(b)
    assert not canary.exists()


def test_compile_carries_a_module_pipelines_source_file(tmp_path, monkeypatch):
    """`--features pkg_mod:fn` (a module on sys.path) goes into the bundle as a copy of its one .py file, as
    a file pipeline does; a package is left out with a warning (a box runs only code the bundle carries)."""
    from edgehft.bundle import Manifest
    from edgehft.compiler.pipeline import _attach_features
    from edgehft.windows import parse_pipeline
    (tmp_path / "team_feats.py").write_text("def windows(paths):\n    return None\n")
    (tmp_path / "team_pkg").mkdir()
    (tmp_path / "team_pkg" / "__init__.py").write_text("def windows(paths):\n    return None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    manifest = Manifest.model_construct(features=None)
    files, warnings = {}, []
    _attach_features(manifest, files, parse_pipeline("team_feats:windows"), warnings)
    assert manifest.features.file == "features/team_feats.py" and manifest.features.callable == "windows"
    assert files == {"features/team_feats.py": tmp_path / "team_feats.py"} and warnings == []
    manifest = Manifest.model_construct(features=None)
    files = {}
    _attach_features(manifest, files, parse_pipeline("team_pkg:windows"), warnings)
    assert manifest.features is None and files == {}
    assert len(warnings) == 1 and "team_pkg:windows is not one .py file" in warnings[0]


def test_a_bundle_as_working_directory_shadows_nothing(deeplob_bundle, tmp_path, canary):
    """`cd BUNDLE && edgehft run . --golden`: the isolated first open runs `python -m` in a child, which
    puts its working directory first on sys.path; a json.py in the bundle (listed or not) must not be
    imported there instead of the standard library's."""
    import subprocess
    import sys
    from pathlib import Path
    b = tmp_path / "b.cpu"
    shutil.copytree(deeplob_bundle, b)
    code = f"import pathlib\npathlib.Path({str(canary)!r}).write_text('ran')\n"
    for name in ("json.py", "numpy.py", "importlib.py", "edgehft.py"):
        (b / name).write_text(code)
    cli = Path(sys.executable).with_name("edgehft")
    env = {**os.environ, "EDGEHFT_CACHE": str(tmp_path / "cache")}      # no marker: the child runs
    p = subprocess.run([str(cli), "run", ".", "--golden"], cwd=b, capture_output=True, text=True, timeout=300,
                       env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "16/16 reproduced" in p.stdout and not canary.exists()
