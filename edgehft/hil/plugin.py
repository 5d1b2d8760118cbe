"""pytest plugin for hardware-in-the-loop tests (registered by the ``pytest11`` entry point ``edgehft``).

    pytest --edgehft-board cpu --edgehft-bundle build/deeplob.cpu [--edgehft-ticks FEED ...] [--edgehft-soak 10]

With ``--edgehft-board`` the session gets ready-made test items ``edgehft::golden`` and
``edgehft::latency`` (first) and ``edgehft::soak`` (last, only with ``--edgehft-soak MINUTES``), whatever
directory pytest runs in, next to the team's own tests. Those can take the session fixtures
``edgehft_runner`` (the runtime opened on the target), ``edgehft_bundle``, ``edgehft_board``,
``edgehft_target`` and ``edgehft_settings``. Without ``--edgehft-board`` the plugin adds nothing and the
fixtures skip. Figures go to the terminal summary and, with ``--edgehft-json FILE``, to a JSON report.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from edgehft.errors import EdgeHFTError
from edgehft.hil import checks as _checks
from edgehft.hil import report
from edgehft.hil.target import Settings, make_target, remote_target_class

CHECKS = ("golden", "latency", "soak")


class _State:
    """Per-session: the settings, the target (opened on first use, shared by the check items and the
    fixtures) and the check results."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.target = None
        self.results: dict[str, dict] = {}
        self.described: dict = {}

    def get_target(self):
        if self.target is None:
            self.target = make_target(self.settings)
        return self.target

    def close(self) -> None:
        if self.target is not None:
            try:
                self.described = self.target.describe()
            finally:
                self.target.close()


_STATE = pytest.StashKey[_State]()


def pytest_addoption(parser) -> None:
    g = parser.getgroup("edgehft", "edgehft hardware-in-the-loop checks")
    add = g.addoption
    add("--edgehft-board", metavar="B", help="board to test on (boards/B.toml); enables the edgehft checks")
    add("--edgehft-bundle", metavar="DIR", help="the bundle to test (required with --edgehft-board on this machine)")
    add("--edgehft-host", metavar="H", help="run on the box user@host[:port] over SSH (needs edgehft.deploy)")
    add("--edgehft-ticks", metavar="FILE", action="append", default=[],
        help="tick file to replay (repeatable; a raw feed, or .npz windows with t_ns). Default: the bundle's "
             "calibration feed if it is still there, else its golden inputs back to back")
    add("--edgehft-emulate", action="store_true", help="open an accelerator board's emulation (results say EMULATED)")
    add("--edgehft-threads", type=int, default=1, metavar="N", help="interpreter threads (default 1)")
    add("--edgehft-affinity", metavar="CPUS", help="pin the test process to these CPUs, e.g. 1 or 0,1")
    add("--edgehft-checks", default="golden,latency", metavar="LIST",
        help="built-in checks to add: golden,latency (default), or none (soak comes with --edgehft-soak)")
    add("--edgehft-samples", type=int, default=_checks.SAMPLES, metavar="N",
        help=f"timed calls of the latency check (default {_checks.SAMPLES})")
    add("--edgehft-warmup", type=int, default=_checks.WARMUP, metavar="N",
        help=f"untimed calls first (default {_checks.WARMUP})")
    add("--edgehft-speed", type=float, default=1.0, metavar="X",
        help="replay recorded tick times X times faster (default 1: real inter-arrival times)")
    add("--edgehft-budget-p99", type=float, metavar="US", help="p99 budget in µs (default: the board file's)")
    add("--edgehft-budget-p999", type=float, metavar="US", help="p99.9 budget in µs (default: the board file's)")
    add("--edgehft-soak", type=float, metavar="MINUTES", help="add edgehft::soak, replaying for MINUTES")
    add("--edgehft-soak-intervals", type=int, default=_checks.SOAK_INTERVALS, metavar="N",
        help=f"soak intervals (default {_checks.SOAK_INTERVALS})")
    add("--edgehft-soak-max-drift", type=float, default=_checks.SOAK_MAX_P99_DRIFT, metavar="FRACTION",
        help=f"fail when the last interval's p99 exceeds the first's by more than this "
             f"(default {_checks.SOAK_MAX_P99_DRIFT:g} = +{_checks.SOAK_MAX_P99_DRIFT:.0%})")
    add("--edgehft-soak-max-growth-mb", type=float, default=_checks.SOAK_MAX_RSS_GROWTH_MB, metavar="MIB",
        help=f"fail when resident memory grows more than this from the first interval to the last "
             f"(default {_checks.SOAK_MAX_RSS_GROWTH_MB:g} MiB)")
    add("--edgehft-json", metavar="FILE", help="write the check results as JSON")
    add("--edgehft-ssh-config", metavar="FILE", help="remote: OpenSSH config file (default the user's)")
    add("--edgehft-remote-python", metavar="PATH", help="remote: the box's python with edgehft")
    add("--edgehft-remote-bundle", metavar="DIR", help="remote: bundle directory on the box (default: active)")


def _settings(config) -> Settings | None:
    """The options as :class:`Settings`, or None without ``--edgehft-board``. Raises pytest.UsageError."""
    o = config.getoption
    board = o("edgehft_board")
    if not board:
        given = [f"--edgehft-{n.replace('_', '-')}" for n in ("bundle", "host", "ticks", "soak", "emulate", "json")
                 if o(f"edgehft_{n}")]
        if given:
            raise pytest.UsageError(f"{', '.join(given)} need --edgehft-board B (the board to test on)")
        return None
    from edgehft.boards import load_board
    try:
        load_board(board)
    except EdgeHFTError as exc:
        raise pytest.UsageError(f"--edgehft-board: {exc}") from None
    names = [c.strip() for c in o("edgehft_checks").split(",") if c.strip()]
    names = [] if names == ["none"] else names
    bad = [c for c in names if c not in CHECKS[:2]]
    if bad:
        raise pytest.UsageError(f"--edgehft-checks: unknown check(s) {', '.join(bad)}; choose from golden, latency, "
                                "none (soak comes with --edgehft-soak MINUTES)")
    soak = o("edgehft_soak")
    if soak is not None:
        if not soak > 0:
            raise pytest.UsageError(f"--edgehft-soak {soak}: give a duration in minutes > 0 (e.g. 0.5)")
        names.append("soak")
    numbers = [("samples", o("edgehft_samples") >= 1), ("warmup", o("edgehft_warmup") >= 0),
               ("threads", o("edgehft_threads") >= 1), ("speed", o("edgehft_speed") > 0),
               ("soak-intervals", o("edgehft_soak_intervals") >= 2),
               ("budget-p99", (o("edgehft_budget_p99") or 1) > 0), ("budget-p999", (o("edgehft_budget_p999") or 1) > 0)]
    for name, ok in numbers:
        if not ok:
            raise pytest.UsageError(f"--edgehft-{name} {o('edgehft_' + name.replace('-', '_'))} is out of range "
                                    "(samples, threads, speed, budgets > 0; warmup >= 0; soak-intervals >= 2)")
    affinity = None
    if o("edgehft_affinity"):
        try:
            affinity = [int(c) for c in o("edgehft_affinity").split(",")]
        except ValueError:
            raise pytest.UsageError(f"--edgehft-affinity {o('edgehft_affinity')!r}: give CPU ids, e.g. 1 or 0,1") from None
    host, bundle = o("edgehft_host"), o("edgehft_bundle")
    if host and remote_target_class() is None:
        raise pytest.UsageError("remote targets need edgehft.deploy (not yet available); drop --edgehft-host to "
                                "run the checks on this machine")
    if not host:
        if not bundle:
            raise pytest.UsageError(f"--edgehft-board {board} needs --edgehft-bundle DIR (the bundle to test, from "
                                    f"`edgehft compile ... --board {board} --out DIR`)")
        _check_bundle(bundle, board)
    return Settings(board=board, bundle=Path(bundle).resolve() if bundle else None, host=host,
                    emulate=o("edgehft_emulate"), threads=o("edgehft_threads"), affinity=affinity,
                    ticks=[str(Path(t).resolve()) for t in o("edgehft_ticks")], samples=o("edgehft_samples"),
                    warmup=o("edgehft_warmup"), speed=o("edgehft_speed"), budget_p99=o("edgehft_budget_p99"),
                    budget_p999=o("edgehft_budget_p999"), soak_minutes=soak,
                    soak_intervals=o("edgehft_soak_intervals"), soak_max_p99_drift=o("edgehft_soak_max_drift"),
                    soak_max_rss_growth_mb=o("edgehft_soak_max_growth_mb"), checks=names,
                    json_path=o("edgehft_json"), ssh_config=o("edgehft_ssh_config"),
                    remote_python=o("edgehft_remote_python"), remote_bundle=o("edgehft_remote_bundle"))


def _check_bundle(bundle: str, board: str) -> None:
    from edgehft.bundle import load_bundle
    try:
        b = load_bundle(bundle, verify=True)
    except EdgeHFTError as exc:
        raise pytest.UsageError(f"--edgehft-bundle: {exc}") from None
    if b.manifest.board != board:
        raise pytest.UsageError(f"--edgehft-bundle {bundle} was compiled for board {b.manifest.board!r}, not {board!r}; "
                                f"compile it with --board {board}, or test with --edgehft-board {b.manifest.board}")


def pytest_configure(config) -> None:
    s = _settings(config)
    if s is not None:
        config.stash[_STATE] = _State(s)


def pytest_report_header(config):
    state = config.stash.get(_STATE, None)
    if state is None:
        return None
    s = state.settings
    where = f"box {s.host}" if s.host else "this machine"
    return (f"edgehft: board {s.board}{' (EMULATED)' if s.emulate else ''} on {where}, bundle "
            f"{s.bundle or s.remote_bundle or 'active on the box'}; checks: {', '.join(s.checks) or 'none'}")


class CheckFailed(Exception):
    """A built-in check's figures are outside its limits (the message has them)."""


class EdgehftChecks(pytest.Collector):
    """The parent of the built-in check items (node id ``edgehft``); its items are made in
    :func:`pytest_collection_modifyitems`."""

    def collect(self):
        return []


class EdgehftCheck(pytest.Item):
    """One built-in check (``edgehft::golden`` / ``latency`` / ``soak``) run on the session's target."""

    def __init__(self, *, check: str, **kw):
        super().__init__(**kw)
        self.check = check

    def runtest(self) -> None:
        state = self.config.stash[_STATE]
        target, s = state.get_target(), state.settings
        if self.check == "golden":
            res = target.golden()
        elif self.check == "latency":
            res = target.latency(**s.latency_options())
        else:
            res = target.soak(**s.soak_options())
        state.results[self.check] = res
        self.user_properties.append((f"edgehft_{self.check}", report.headline(res)))
        if res["ok"] is None:
            pytest.skip(report.headline(res))
        if not res["ok"]:
            raise CheckFailed(report.headline(res))

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, CheckFailed):
            return f"edgehft::{self.check} FAILED: {excinfo.value}"
        if isinstance(excinfo.value, EdgeHFTError):
            return f"edgehft::{self.check}: {type(excinfo.value).__name__}: {excinfo.value}"
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self):
        return self.path, None, f"edgehft::{self.check}"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session, config, items) -> None:
    """Put the built-in checks into the session: golden and latency first, soak last (tryfirst, so -k and
    -m deselection see them)."""
    state = config.stash.get(_STATE, None)
    if state is None or not state.settings.checks:
        return
    from _pytest.reports import CollectReport
    here = config.invocation_params.dir          # node id under the current directory: shown as edgehft::...
    try:
        base = here.relative_to(config.rootpath).as_posix()
    except ValueError:
        base = "."
    parent = EdgehftChecks.from_parent(session, name="edgehft", path=here,
                                       nodeid="edgehft" if base == "." else f"{base}/edgehft")
    made = [EdgehftCheck.from_parent(parent, name=c, check=c) for c in state.settings.checks]
    items[:0] = [i for i in made if i.check != "soak"]
    items.extend(i for i in made if i.check == "soak")
    config.hook.pytest_collectreport(report=CollectReport(parent.nodeid, "passed", None, made))


def _state_or_skip(config) -> _State:
    state = config.stash.get(_STATE, None)
    if state is None:
        pytest.skip("no target: run pytest with --edgehft-board B --edgehft-bundle DIR")
    return state


@pytest.fixture(scope="session")
def edgehft_settings(request) -> Settings:
    """The plugin's options (:class:`edgehft.hil.target.Settings`: board, bundle, ticks, budgets, ...)."""
    return _state_or_skip(request.config).settings


@pytest.fixture(scope="session")
def edgehft_board(request):
    """The :class:`edgehft.boards.Board` under test (its ``latency_budget_us``, ``runtime``, ...)."""
    from edgehft.boards import load_board
    return load_board(_state_or_skip(request.config).settings.board)


@pytest.fixture(scope="session")
def edgehft_bundle(request):
    """The local bundle (:class:`edgehft.bundle.Bundle`), every file verified against its manifest."""
    from edgehft.bundle import load_bundle
    s = _state_or_skip(request.config).settings
    if s.bundle is None:
        pytest.skip("no local bundle: give --edgehft-bundle DIR")
    return load_bundle(s.bundle, verify=True)


@pytest.fixture(scope="session")
def edgehft_target(request):
    """The target the checks run on: a :class:`edgehft.hil.target.LocalTarget` (or, with
    ``--edgehft-host``, a remote one): ``golden()``, ``latency(...)``, ``soak(...)`` return result dicts."""
    try:
        return _state_or_skip(request.config).get_target()
    except EdgeHFTError as exc:
        pytest.fail(f"cannot open the edgehft target: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def edgehft_runner(edgehft_target):
    """The runtime opened on the board in this process (``predict(window)``, ``predict_raw``,
    ``describe()``), shared by the session and closed at its end. Skips for remote targets."""
    if not hasattr(edgehft_target, "runner"):
        pytest.skip("with --edgehft-host the model runs on the box, not in this process: use edgehft_target")
    try:
        return edgehft_target.runner
    except EdgeHFTError as exc:
        pytest.fail(f"cannot open the bundle on the board: {exc}", pytrace=False)


def pytest_sessionfinish(session) -> None:
    state = session.config.stash.get(_STATE, None)
    if state is None:
        return
    state.close()
    s = state.settings
    if s.json_path:
        out = {"board": s.board, "bundle": str(s.bundle) if s.bundle else None, "host": s.host,
               "emulated": s.emulate, "target": state.described, "checks": state.results,
               "settings": {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(s).items()}}
        Path(s.json_path).write_text(json.dumps(out, indent=1) + "\n")


def pytest_terminal_summary(terminalreporter, config) -> None:
    state = config.stash.get(_STATE, None)
    if state is None or not state.results:
        return
    s, tr = state.settings, terminalreporter
    tr.section("edgehft hardware-in-the-loop")
    name = Path(str(s.bundle or s.remote_bundle or "active bundle")).name
    title = (f"{name} on {s.board}" + (" — EMULATED" if s.emulate else "") + (f" at {s.host}" if s.host else "")
             + ("" if not state.described.get("interpreter") else f" ({state.described['interpreter']})"))
    markup, width = tr.hasmarkup, tr._tw.fullwidth
    tr.write(report.summary_table(state.results, title, markup, width))
    if "soak" in state.results:
        tr.write(report.soak_table(state.results["soak"], markup, width))
    if s.json_path:
        tr.write_line(f"JSON report: {s.json_path}")
