"""Where the HIL checks run: this machine (:class:`LocalTarget`) or a box over SSH (``RemoteTarget`` from
``edgehft.deploy.remote``, same methods, same result dicts).

A target has ``golden()``, ``latency(ticks=..., samples=..., ...)``, ``streaming(..., compare=...)``,
``soak(minutes=..., ...)`` returning the JSON dicts of :mod:`edgehft.hil.checks`, ``describe()`` and
``close()``. A local target also exposes ``runner``: the runtime opened in this process, for a team's own
tests.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from edgehft.hil import checks


@dataclass
class Settings:
    """The plugin's options, parsed (see ``pytest --help``, group ``edgehft``)."""

    board: str
    bundle: Path | None = None
    host: str | None = None
    emulate: bool = False
    threads: int = 1
    affinity: list[int] | None = None
    ticks: list[str] = field(default_factory=list)
    samples: int = checks.SAMPLES
    warmup: int = checks.WARMUP
    speed: float = 1.0
    budget_p99: float | None = None
    budget_p999: float | None = None
    stream_compare: int = checks.STREAM_COMPARE
    soak_minutes: float | None = None
    soak_intervals: int = checks.SOAK_INTERVALS
    soak_max_p99_drift: float = checks.SOAK_MAX_P99_DRIFT
    soak_max_rss_growth_mb: float = checks.SOAK_MAX_RSS_GROWTH_MB
    checks: list[str] = field(default_factory=lambda: ["golden", "latency"])
    json_path: str | None = None
    ssh_config: str | None = None
    remote_python: str | None = None
    remote_bundle: str | None = None
    install_dir: str | None = None
    run_features: bool = False       # raw feeds in ``ticks`` go through the bundle's feature pipeline (its code)

    def latency_options(self) -> dict:
        """Keyword arguments of ``target.latency`` (plain values: they travel to a box as they are)."""
        return {"ticks": list(self.ticks), "samples": self.samples, "warmup": self.warmup, "speed": self.speed,
                "budget_p99": self.budget_p99, "budget_p999": self.budget_p999, "run_features": self.run_features}

    def streaming_options(self) -> dict:
        """Keyword arguments of ``target.streaming``: the latency check's, and the outputs to compare."""
        return {**self.latency_options(), "compare": self.stream_compare}

    def soak_options(self) -> dict:
        """Keyword arguments of ``target.soak``."""
        return {"minutes": self.soak_minutes, "ticks": list(self.ticks), "intervals": self.soak_intervals,
                "warmup": self.warmup, "speed": self.speed, "max_p99_drift": self.soak_max_p99_drift,
                "max_rss_growth_mb": self.soak_max_rss_growth_mb, "run_features": self.run_features}


class LocalTarget:
    """The board is this machine: the bundle is opened here with :func:`edgehft.runtime.open`, once, on
    first use (``emulate`` opens an accelerator board's emulation; the results then say EMULATED)."""

    kind = "local"

    def __init__(self, board: str, bundle: str | Path, *, emulate: bool = False, threads: int = 1,
                 affinity: list[int] | None = None):
        self.board, self.bundle_path, self.emulate = board, Path(bundle), emulate
        self.threads, self.affinity = threads, affinity
        self._runner = None

    @property
    def runner(self):
        """The opened runtime.

        Raises:
            BundleError: the bundle does not match its manifest or is for another board.
            BoardUnavailableError: the board's library or device is missing here (try ``emulate``).
        """
        if self._runner is None:
            from edgehft import runtime
            opts = {"emulate": True} if self.emulate else {}
            self._runner = runtime.open(self.bundle_path, self.board, threads=self.threads,
                                        affinity=self.affinity, **opts)
        return self._runner

    def golden(self) -> dict:
        return checks.golden(self.runner)

    def latency(self, **options) -> dict:
        return checks.latency(self.runner, **options)

    def streaming(self, **options) -> dict:
        """:func:`edgehft.hil.checks.streaming` on the runner (a skip result when the bundle does not stream)."""
        return checks.streaming(self.runner, **options)

    def soak(self, swap_every_s: float | None = None, **options) -> dict:
        """:func:`edgehft.hil.checks.soak`; with ``swap_every_s`` the soak across swaps
        (:func:`edgehft.serving.soak.soak_swaps`: the bundle served from a fresh install dir, installed again every
        ``swap_every_s`` seconds)."""
        if swap_every_s is None:
            return checks.soak(self.runner, **options)
        from edgehft.serving.soak import soak_check
        return soak_check(self.runner, options.pop("minutes"), swap_every_s, **options)

    def describe(self) -> dict:
        """What runs: ``{"kind": "local", "board", "bundle", "emulated", ...}`` plus the runner's own
        description once it is open."""
        d = {"kind": self.kind, "board": self.board, "bundle": str(self.bundle_path), "emulated": self.emulate}
        if self._runner is not None:
            d.update(self._runner.describe())
        return d

    def close(self) -> None:
        if self._runner is not None:
            self._runner.close()
            self._runner = None


def make_target(s: Settings):
    """A :class:`LocalTarget`, or with ``s.host`` a :class:`edgehft.deploy.remote.RemoteTarget` (the checks
    run on the box, over SSH, on its active bundle or ``s.remote_bundle``).

    Raises:
        InputError: ``s.host`` is not ``user@host[:port]``.
    """
    if s.host:
        from edgehft.deploy.remote import RemoteTarget
        return RemoteTarget(s.host, s.board, bundle_dir_on_box=s.remote_bundle, ssh_config=s.ssh_config,
                            remote_python=s.remote_python, install_dir=s.install_dir, emulate=s.emulate)
    return LocalTarget(s.board, s.bundle, emulate=s.emulate, threads=s.threads, affinity=s.affinity)
