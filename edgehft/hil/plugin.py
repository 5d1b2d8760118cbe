"""pytest plugin for hardware-in-the-loop tests (registered by the ``pytest11`` entry point ``edgehft``).

    pytest --edgehft-board cpu --edgehft-bundle build/deeplob.cpu [--edgehft-ticks FEED ...] [--edgehft-soak 10]

With ``--edgehft-board`` the session gets ready-made test items ``edgehft::golden`` and
``edgehft::latency`` (first; ``edgehft::streaming`` after them with ``--edgehft-checks ...,streaming``) and
``edgehft::soak`` (last, only with ``--edgehft-soak MINUTES``; across swaps, the bundle installed again every S
seconds under edgehft.serve, with ``--edgehft-soak-swap-every S``), whatever directory pytest runs in, next
to the team's own tests. Those can take the session fixtures ``edgehft_runner`` (the runtime opened on the
target), ``edgehft_bundle``, ``edgehft_board``, ``edgehft_target`` and ``edgehft_settings``. Without ``--edgehft-board`` the plugin adds nothing and the
fixtures skip. Figures go to the terminal summary and, with ``--edgehft-json FILE``, to a JSON report.

A board that is unavailable here (its library or device missing) is found once, by the first test that needs it:
that test and every other one that needs the board (the checks, ``edgehft_target``, ``edgehft_runner``) skip with
one reason, and the summary says why and how to fix it. Under pytest-xdist the workers send their results to the
controller, which writes the JSON report and the summary for all of them (:mod:`edgehft.hil.workers`).
"""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest

from edgehft.errors import BoardUnavailableError, EdgeHFTError, MissingExtraError
from edgehft.hil import summary, workers
from edgehft.hil.options import add_options, settings_from
from edgehft.hil.target import Settings, make_target


class _State:
    """Per-session: the settings, the target (opened on first use, shared by the check items and the
    fixtures) and the check results."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.target = None
        self.results: dict[str, dict] = {}
        self.described: dict = {}
        self.unavailable: dict | None = None     # {"error", "message", "hint"}: the board, found unavailable
        self.unavailable_skips = 0                # tests skipped for it
        self.opened = False
        self.timeline = workers.Timeline()        # under xdist, in the controller: when each test ran, where

    def get_target(self):
        """The target (:func:`edgehft.hil.target.make_target`), made on first use; nothing is opened yet."""
        if self.target is None:
            self.target = make_target(self.settings)
        return self.target

    def probe(self) -> bool:
        """Open the board (a local target's runtime; a remote one is reached by each check), the first time only;
        False when it is unavailable (:class:`BoardUnavailableError`, :class:`MissingExtraError`: kept in
        :attr:`unavailable`, the hint in the plugin's words). Other errors are raised, to the test that asked."""
        if not self.opened and self.unavailable is None:
            try:
                target = self.get_target()
                if getattr(target, "kind", None) == "local":
                    target.runner                    # opens the bundle on the board
                self.opened = True
            except (BoardUnavailableError, MissingExtraError) as exc:
                message = exc.args[0] if exc.args else str(exc)
                self.unavailable = {"error": type(exc).__name__, "message": message, "hint": _pytest_hint(exc.hint)}
        return self.unavailable is None

    def open(self):
        """The target with its board opened; skips (one reason, :func:`unavailable_reason`) when it is
        unavailable."""
        if not self.probe():
            pytest.skip(unavailable_reason(self.settings, self.unavailable))
        return self.target

    def close(self) -> None:
        if self.target is not None:                 # a remote target may have neither method
            describe, close = getattr(self.target, "describe", None), getattr(self.target, "close", None)
            try:
                self.described = describe() if describe else {}
            finally:
                if close:
                    close()


_STATE = pytest.StashKey[_State]()


def pytest_addoption(parser) -> None:
    add_options(parser)


MARKERS = {
    "edgehft_board": "a check on the board (edgehft's built-in checks carry it): -m 'not edgehft_board' leaves "
                     "the hardware out",
    "edgehft_latency": "a timed check (latency, streaming, soak): -m 'not edgehft_latency' keeps the correctness "
                       "checks only",
}
TIMED = ("latency", "streaming", "soak")


def _pytest_hint(hint: str | None) -> str | None:
    """A runtime's hint in the plugin's words (``--emulate`` is ``--edgehft-emulate`` here)."""
    return hint.replace("--emulate", "--edgehft-emulate") if hint else hint


def unavailable_reason(s: Settings, u: dict) -> str:
    """The one skip reason of every test that needs a board found unavailable: what is missing and how to fix
    it, on one line (the full hint is in the edgehft section of the terminal summary)."""
    first = u["message"].splitlines()[0]
    fix = "run where the board is attached with its runtime installed (the hint is in the edgehft summary)"
    if not s.emulate and "--edgehft-emulate" in (u["hint"] or ""):
        fix += ", or add --edgehft-emulate to run its emulation (results say EMULATED)"
    return f"edgehft: board {s.board} is unavailable on this machine: {first}; fix: {fix}"


def pytest_configure(config) -> None:
    for name, what in MARKERS.items():           # registered in every session (--strict-markers suites use them)
        config.addinivalue_line("markers", f"{name}: {what}")
    s = settings_from(config)
    if s is not None:
        state = config.stash[_STATE] = _State(s)
        config.pluginmanager.register(state.timeline, "edgehft-timeline")   # its pytest_runtest_logreport


NEEDS_BOARD = ("edgehft_target", "edgehft_runner")       # fixtures that open the board


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item) -> None:
    """Before a test that needs the board (a built-in check, or one taking ``edgehft_target`` /
    ``edgehft_runner``): open it, once per session; where it is unavailable, skip the test here, with the
    same reason from the same place for every such test, so pytest's ``-rs`` folds them into one line. Any other
    error opening it is left to the test, which meets it again and reports it in its own words."""
    state = item.config.stash.get(_STATE, None)
    if state is None or not (isinstance(item, EdgehftCheck)
                             or any(f in NEEDS_BOARD for f in getattr(item, "fixturenames", ()))):
        return
    try:
        available = state.probe()
    except EdgeHFTError:
        return
    if not available:
        state.unavailable_skips += 1
        pytest.skip(unavailable_reason(state.settings, state.unavailable))


def pytest_ignore_collect(collection_path, config):
    """Never collect inside a bundle (a directory holding ``manifest.json``: a bundle, or a version in an
    install dir): pytest would import its ``conftest.py`` and ``test_*.py``, code from the bundle, when a
    team runs ``pytest`` next to the bundles it tests. Other paths are left to pytest (None)."""
    path = Path(collection_path)
    if path.is_dir() and (path / "manifest.json").is_file():
        return True
    return None


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
    """One built-in check (``edgehft::golden`` / ``latency`` / ``streaming`` / ``soak``) run on the session's
    target. A result with ``ok`` None skips the item (not judged, or ``skipped``: e.g. a bundle that does not
    stream), with the result's headline as the reason."""

    def __init__(self, *, check: str, **kw):
        super().__init__(**kw)
        self.check = check

    def runtest(self) -> None:
        state = self.config.stash[_STATE]
        target, s = state.open(), state.settings
        started = time.time()
        if self.check == "golden":
            res = target.golden()
        elif self.check == "latency":
            res = target.latency(**s.latency_options())
        elif self.check == "streaming":
            res = target.streaming(**s.streaming_options())
        else:
            every = self.config.getoption("edgehft_soak_swap_every")
            res = target.soak(**s.soak_options(), **({} if every is None else {"swap_every_s": every}))
        if workers.worker_id(self.config) is not None:
            self._mark_worker(res, started, time.time())
        state.results[self.check] = res
        self.user_properties.append((f"edgehft_{self.check}", summary.headline(res)))
        self.user_properties.extend(summary.numbers(res))          # JUnit XML properties as numbers
        if res["ok"] is None:
            pytest.skip(summary.headline(res))
        if not res["ok"]:
            raise CheckFailed(summary.headline(res))

    def _mark_worker(self, res: dict, started: float, ended: float) -> None:
        """Under pytest-xdist: which worker ran the check and when (wall-clock seconds), in ``res["xdist"]``; a
        timed check gets a ``note`` that other tests may have run beside it, which the controller replaces by
        the tests that did (:func:`_measure_beside`) or drops."""
        n = workers.worker_count(self.config)
        res["xdist"] = {"worker": workers.worker_id(self.config), "workers": n, "started": started, "ended": ended}
        if n > 1 and self.check in TIMED and not res.get("skipped"):
            res["xdist"]["note"] = (f"run under pytest-xdist ({n} workers): other tests may have run beside it "
                                    "(the edgehft summary names them)")

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
    """Put the built-in checks into the session: golden, latency and streaming first, soak last (tryfirst, so
    -k and -m deselection see them)."""
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
    for item in made:
        item.add_marker("edgehft_board")
        if workers.xdist_active(config):      # one worker for all checks under --dist loadgroup (and loadfile)
            item.add_marker(pytest.mark.xdist_group(workers.GROUP))
        if item.check in TIMED:
            item.add_marker("edgehft_latency")
    items[:0] = [i for i in made if i.check != "soak"]
    items.extend(i for i in made if i.check == "soak")
    config.hook.pytest_collectreport(report=CollectReport(parent.nodeid, "passed", None, made))


def _state_or_skip(config) -> _State:
    state = config.stash.get(_STATE, None)
    if state is None:
        pytest.skip("no target: run pytest with --edgehft-board=B --edgehft-bundle=DIR")
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
    ``--edgehft-host``, a remote one): ``golden()``, ``latency(...)``, ``streaming(...)``, ``soak(...)`` return
    result dicts. A local target's board is opened here; where it is unavailable the test skips (one reason for
    the whole session)."""
    try:
        return _state_or_skip(request.config).open()
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


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """pytest-xdist, in the controller: merge what a worker that finished found (its check results, the target
    it described, a board it found unavailable) into the session's state, for the JSON report and the summary."""
    state = node.config.stash.get(_STATE, None)
    got = workers.received(node)
    if state is None or got is None:
        return
    state.results.update(got["checks"])
    state.described = state.described or got["target"]
    if got["unavailable"] is not None:
        state.unavailable = state.unavailable or got["unavailable"]
        state.unavailable_skips += got["unavailable_skips"]


def _measure_beside(state: _State) -> None:
    """In the controller: each timed check's ``xdist.beside`` (the tests other workers ran while it was timing)
    and its ``note`` (dropped when nothing ran beside it)."""
    for res in state.results.values():
        x = res.get("xdist")
        if not x or "note" not in x:
            continue
        x["beside"] = state.timeline.beside(x["worker"], x["started"], x["ended"])
        note = workers.concurrency_note(x["beside"], x["workers"])
        if note:
            x["note"] = note
        else:
            del x["note"]


def pytest_sessionfinish(session) -> None:
    """Close the target; a worker sends its results to the controller, which (or the only process, without
    xdist) writes the ``--edgehft-json`` report: every check's result dict, in the order of the checks."""
    state = session.config.stash.get(_STATE, None)
    if state is None:
        return
    state.close()
    s = state.settings
    state.results = {c: state.results[c] for c in s.checks if c in state.results}
    if workers.worker_id(session.config) is not None:
        workers.send(session.config, {"checks": state.results, "target": state.described,
                                      "unavailable": state.unavailable, "unavailable_skips": state.unavailable_skips})
        return
    _measure_beside(state)
    if s.json_path:
        out = {"board": s.board, "bundle": str(s.bundle) if s.bundle else None, "host": s.host,
               "emulated": s.emulate, "target": state.described, "checks": state.results,
               "unavailable": state.unavailable,
               "settings": {**{k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(s).items()},
                            "soak_swap_every_s": session.config.getoption("edgehft_soak_swap_every")}}
        Path(s.json_path).write_text(json.dumps(out, indent=1) + "\n")


def _write_unavailable(tr, state: _State) -> None:
    u, s = state.unavailable, state.settings
    n = state.unavailable_skips
    tr.write_line(f"board {s.board} UNAVAILABLE on this machine: {n} test{'s' if n != 1 else ''} that need it "
                  "skipped (the built-in checks, and tests taking edgehft_target or edgehft_runner)",
                  red=True, bold=True)
    tr.write_line(f"  {u['error']}: {u['message']}")
    if u["hint"]:
        tr.write_line(f"  hint: {u['hint']}")


def pytest_terminal_summary(terminalreporter, config) -> None:
    """The edgehft section: the table of check results (and the soak's intervals), the board found unavailable
    with the fix, the note on timed checks run beside other xdist workers, the JSON report's path."""
    state = config.stash.get(_STATE, None)
    if state is None or not (state.results or state.unavailable):
        return
    s, tr = state.settings, terminalreporter
    tr.section("edgehft hardware-in-the-loop")
    if state.unavailable:
        _write_unavailable(tr, state)
    if state.results:
        name = Path(str(s.bundle or s.remote_bundle or "active bundle")).name
        title = (f"{name} on {s.board}" + (" — EMULATED" if s.emulate else "") + (f" at {s.host}" if s.host else "")
                 + ("" if not state.described.get("interpreter") else f" ({state.described['interpreter']})"))
        markup, width = tr.hasmarkup, tr._tw.fullwidth
        tr.write(summary.summary_table(state.results, title, markup, width))
        if "soak" in state.results:
            tr.write(summary.soak_table(state.results["soak"], markup, width))
    beside = sorted(c for c, r in state.results.items() if (r.get("xdist") or {}).get("note"))
    if beside:
        tr.write_line(f"NOTE: {' and '.join(beside)} {'were' if len(beside) > 1 else 'was'} timed while other tests ran "
                      f"on other pytest-xdist workers (see the figures); {workers.ADVICE}", yellow=True)
    if s.json_path:
        tr.write_line(f"JSON report: {s.json_path}")
