"""The ``--edgehft-*`` pytest options and their checks (the plugin itself is :mod:`edgehft.hil.plugin`)."""
from __future__ import annotations

from pathlib import Path

import pytest

from edgehft.errors import EdgeHFTError
from edgehft.hil import checks as _checks
from edgehft.hil.target import Settings

CHECKS = ("golden", "latency", "streaming", "soak")
LISTED = CHECKS[:3]          # the ones --edgehft-checks names (soak comes with --edgehft-soak)


def add_options(parser) -> None:
    """Register the ``--edgehft-*`` options (group ``edgehft``) with pytest's ``parser``."""
    g = parser.getgroup("edgehft", "edgehft hardware-in-the-loop checks")
    add = g.addoption
    add("--edgehft-board", metavar="B", help="board to test on (boards/B.toml); enables the edgehft checks")
    add("--edgehft-bundle", metavar="DIR", help="the bundle to test (required with --edgehft-board on this machine)")
    add("--edgehft-host", metavar="H", help="run on the box user@host[:port] over SSH (needs edgehft.deploy)")
    add("--edgehft-ticks", metavar="FILE", action="append", default=[],
        help="tick file to replay (repeatable; .npz windows with t_ns, .npy windows, or a raw feed with "
             "--edgehft-run-features). Default: the bundle's golden inputs back to back")
    add("--edgehft-run-features", action="store_true",
        help="make windows from raw feed files with the bundle's feature pipeline: Python code from the bundle "
             "(hash-checked), run in the test process or on the box; only for bundles you trust")
    add("--edgehft-emulate", action="store_true", help="open an accelerator board's emulation (results say EMULATED)")
    add("--edgehft-threads", type=int, default=1, metavar="N", help="interpreter threads (default 1)")
    add("--edgehft-affinity", metavar="CPUS", help="pin the test process to these CPUs, e.g. 1 or 0,1")
    add("--edgehft-checks", default="golden,latency", metavar="LIST",
        help="built-in checks to add: golden,latency (default), streaming (push latency through runner.stream() "
             "and its outputs against predict), or none (soak comes with --edgehft-soak)")
    add("--edgehft-samples", type=int, default=_checks.SAMPLES, metavar="N",
        help=f"timed calls of the latency check (default {_checks.SAMPLES})")
    add("--edgehft-warmup", type=int, default=_checks.WARMUP, metavar="N",
        help=f"untimed calls first (default {_checks.WARMUP})")
    add("--edgehft-speed", type=float, default=1.0, metavar="X",
        help="replay recorded tick times X times faster (default 1: real inter-arrival times)")
    add("--edgehft-stream-compare", type=int, default=_checks.STREAM_COMPARE, metavar="N",
        help=f"streaming check: outputs compared bit for bit with predict of the same window "
             f"(default {_checks.STREAM_COMPARE})")
    add("--edgehft-budget-p99", type=float, metavar="US", help="p99 budget in µs (default: the board file's)")
    add("--edgehft-budget-p999", type=float, metavar="US", help="p99.9 budget in µs (default: the board file's)")
    add("--edgehft-soak", type=float, metavar="MINUTES", help="add edgehft::soak, replaying for MINUTES")
    add("--edgehft-soak-swap-every", type=float, metavar="S",
        help="soak across swaps: serve the bundle with edgehft.serve and install it again every S seconds (each "
             "version shadow-run and swapped in while the soak calls); p99.9 near swaps vs away, failed calls")
    add("--edgehft-soak-intervals", type=int, default=_checks.SOAK_INTERVALS, metavar="N",
        help=f"soak intervals (default {_checks.SOAK_INTERVALS})")
    add("--edgehft-soak-max-drift", type=float, default=_checks.SOAK_MAX_P99_DRIFT, metavar="FRACTION",
        help=f"fail when the last interval's p99 exceeds the first's by more than this "
             f"(default {_checks.SOAK_MAX_P99_DRIFT:g} = +{_checks.SOAK_MAX_P99_DRIFT * 100:g} %%)")
    add("--edgehft-soak-max-growth-mb", type=float, default=_checks.SOAK_MAX_RSS_GROWTH_MB, metavar="MIB",
        help=f"fail when resident memory grows more than this from the first interval to the last "
             f"(default {_checks.SOAK_MAX_RSS_GROWTH_MB:g} MiB)")
    add("--edgehft-json", metavar="FILE", help="write the check results as JSON")
    add("--edgehft-ssh-config", metavar="FILE", help="remote: OpenSSH config file (default the user's)")
    add("--edgehft-remote-python", metavar="PATH", help="remote: the box's python with edgehft")
    add("--edgehft-remote-bundle", metavar="DIR", help="remote: bundle directory on the box (default: active)")
    add("--edgehft-install-dir", metavar="DIR",
        help="remote: edgehft deploy's install directory on the box (default: the board file's [ssh] install_dir)")


def settings_from(config) -> Settings | None:
    """The options as :class:`Settings`, or None without ``--edgehft-board``.

    Raises:
        pytest.UsageError: an option without ``--edgehft-board``, unknown board, no or bad bundle, a bundle
            for another board, values out of range, ``--edgehft-host`` with a local ``--edgehft-bundle``.
    """
    o = config.getoption
    board = o("edgehft_board")
    if not board:
        given = [f"--edgehft-{n.replace('_', '-')}" for n in ("bundle", "host", "ticks", "soak", "soak_swap_every",
                                                                "emulate", "json") if o(f"edgehft_{n}")]
        if given:
            raise pytest.UsageError(f"{', '.join(given)} need --edgehft-board=B (the board to test on)")
        return None
    from edgehft.boards import load_board
    try:
        load_board(board)
    except EdgeHFTError as exc:
        raise pytest.UsageError(f"--edgehft-board: {exc}") from None
    names = [c.strip() for c in o("edgehft_checks").split(",") if c.strip()]
    names = [] if names == ["none"] else names
    bad = [c for c in names if c not in LISTED]
    if bad:
        raise pytest.UsageError(f"--edgehft-checks: unknown check(s) {', '.join(bad)}; choose from golden, latency, "
                                "streaming, none (soak comes with --edgehft-soak MINUTES)")
    soak = o("edgehft_soak")
    if soak is not None:
        if not soak > 0:
            raise pytest.UsageError(f"--edgehft-soak {soak}: give a duration in minutes > 0 (e.g. 0.5)")
        names.append("soak")
    swap = o("edgehft_soak_swap_every")
    if swap is not None and (soak is None or not swap > 0):
        raise pytest.UsageError(f"--edgehft-soak-swap-every {swap}: give seconds > 0, with --edgehft-soak MINUTES")
    numbers = [("samples", o("edgehft_samples") >= 1), ("warmup", o("edgehft_warmup") >= 0),
               ("threads", o("edgehft_threads") >= 1), ("speed", o("edgehft_speed") > 0),
               ("soak-intervals", o("edgehft_soak_intervals") >= 2),
               ("stream-compare", o("edgehft_stream_compare") >= 1),
               ("budget-p99", (o("edgehft_budget_p99") or 1) > 0), ("budget-p999", (o("edgehft_budget_p999") or 1) > 0)]
    for name, ok in numbers:
        if not ok:
            raise pytest.UsageError(f"--edgehft-{name} {o('edgehft_' + name.replace('-', '_'))} is out of range "
                                    "(samples, threads, speed, budgets, stream-compare > 0; warmup >= 0; "
                                    "soak-intervals >= 2)")
    affinity = None
    if o("edgehft_affinity"):
        try:
            affinity = [int(c) for c in o("edgehft_affinity").split(",")]
        except ValueError:
            raise pytest.UsageError(f"--edgehft-affinity {o('edgehft_affinity')!r}: give CPU ids, e.g. 1 or 0,1") from None
    host, bundle = o("edgehft_host"), o("edgehft_bundle")
    if host and bundle:
        raise pytest.UsageError("--edgehft-host runs the checks on the box's active bundle (`edgehft deploy` it "
                                "first) or --edgehft-remote-bundle DIR on the box; drop --edgehft-bundle")
    if not host:
        if not bundle:
            raise pytest.UsageError(f"--edgehft-board {board} needs --edgehft-bundle DIR (the bundle to test, from "
                                    f"`edgehft compile ... --board {board} --out DIR`)")
        _check_bundle(bundle, board)
    return Settings(board=board, bundle=Path(bundle).resolve() if bundle else None, host=host,
                    emulate=o("edgehft_emulate"), threads=o("edgehft_threads"), affinity=affinity,
                    ticks=[str(Path(t).resolve()) for t in o("edgehft_ticks")], samples=o("edgehft_samples"),
                    warmup=o("edgehft_warmup"), speed=o("edgehft_speed"), budget_p99=o("edgehft_budget_p99"),
                    budget_p999=o("edgehft_budget_p999"), stream_compare=o("edgehft_stream_compare"),
                    soak_minutes=soak,
                    soak_intervals=o("edgehft_soak_intervals"), soak_max_p99_drift=o("edgehft_soak_max_drift"),
                    soak_max_rss_growth_mb=o("edgehft_soak_max_growth_mb"), checks=names,
                    json_path=o("edgehft_json"), ssh_config=o("edgehft_ssh_config"),
                    remote_python=o("edgehft_remote_python"), remote_bundle=o("edgehft_remote_bundle"),
                    install_dir=o("edgehft_install_dir"), run_features=o("edgehft_run_features"))


def _check_bundle(bundle: str, board: str) -> None:
    from edgehft.bundle import load_bundle
    try:
        b = load_bundle(bundle, verify=True)
    except EdgeHFTError as exc:
        raise pytest.UsageError(f"--edgehft-bundle: {exc}") from None
    if b.manifest.board != board:
        raise pytest.UsageError(f"--edgehft-bundle {bundle} was compiled for board {b.manifest.board!r}, not {board!r}; "
                                f"compile it with --board {board}, or test with --edgehft-board {b.manifest.board}")
