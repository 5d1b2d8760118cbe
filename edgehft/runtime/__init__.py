"""The board runtime: ``open(bundle, board) -> Runner`` with ``predict`` / ``close``.

Never imports TensorFlow. One module per backend, found through :mod:`edgehft.backends` from the board's
``backend`` field (the built-ins are ``edgehft/runtime/<backend>.py``; a plugin names its own); each exposes a
``Runner`` subclass of :class:`edgehft.runtime.base.Runner`. Beside them: ``litert`` (the LiteRT helpers the
cpu, coral and pynq runners share), ``native_chain`` and ``arena`` (the cpu board's native plans),
``coral_device`` (libedgetpu through ctypes), ``isolate`` (a bundle's first open in a child process), ``plans``
(which of a bundle's execution plans a runner opens; timing and choosing them on a box).

    from edgehft import runtime
    with runtime.open("deeplob.bundle", threads=1, affinity=[1]) as r:
        probs = r.predict(window)        # float32 (1, 3), a reused buffer
"""
from __future__ import annotations

from pathlib import Path

from edgehft import backends
from edgehft.boards import load_board
from edgehft.bundle import Bundle, load_bundle
from edgehft.errors import BundleError, InputError
from edgehft.runtime.base import Runner

__all__ = ["open", "Runner"]


def open(bundle: str | Path | Bundle, board: str | None = None, *, threads: int = 1,
         affinity: list[int] | None = None, require_signature: str | Path | bool | None = None,
         plan: str | None = None, **options) -> Runner:  # noqa: A001 - mirrors builtins.open
    """Open ``bundle`` on ``board`` (default: the board it was compiled for).

    Args:
        bundle: bundle directory or an already loaded :class:`Bundle` (re-verified here).
        board: board name from the catalog; must be the bundle's board.
        threads: interpreter threads (1 for the lowest jitter).
        affinity: CPU ids to pin this process to (``os.sched_setaffinity``), or None to leave it.
        require_signature: an ``allowed_signers`` file the bundle's ``manifest.json.sig`` must verify
            against (checked before the manifest is read), or True for the install dir's (the bundle is
            ``<dir>/current`` or ``<dir>/versions/<vid>``: ``<dir>/allowed_signers``); None/False: no check.
            See :mod:`edgehft.signing`.
        plan: the execution plan to run, by name (a bundle that carries several: ``Bundle.plan_names()``);
            None: the plan recorded for this version on this box (a bundle opened as ``<install_dir>/current``
            or ``versions/<vid>`` after ``edgehft deploy`` timed its plans there), else the bundle's top level
            (the compile host's choice). The runner's ``plan`` and ``plan_source`` say which and why
            (:func:`edgehft.runtime.plans.runner_plan`).
        options: backend-specific (cpu: ``op_resolver`` = ``auto`` | ``builtin`` | ``reference``;
            coral: ``device`` = ``usb`` | ``usb:N`` | ``pci`` | ``pci:N``, ``emulate`` = run the int8 graph
            on this CPU).
    Raises:
        InputError: ``emulate``/``device`` given for a board that runs on the host CPU (cpu), or any option
            the board's ``Runner`` does not take (e.g. ``overlay`` for a cpu board); a
            ``require_signature`` file that is not readable, or True for a bundle outside an install dir; a
            ``plan`` the bundle does not carry (the message lists its plans).
        BundleError: malformed bundle, files that do not match the manifest, or a board mismatch; a damaged plan
            record on the box;
            :class:`~edgehft.signing.SignatureError` for a missing or untrusted signature; a model that
            LiteRT refuses or crashes on in its first, isolated open (:mod:`edgehft.runtime.isolate`).
        BoardUnavailableError: the backend's library or device is missing on this machine, or no backend of
            the board's name is installed (the message lists the installed ones).
    """
    path = bundle.path if isinstance(bundle, Bundle) else bundle
    if require_signature:       # on the resolved path: a `current` swapped meanwhile cannot slip another in
        from edgehft.signing import require_signature as check_signature
        path = Path(path).resolve()
        check_signature(path, require_signature)
    b = load_bundle(path, verify=True)
    name = board or b.manifest.board
    spec = load_board(name)
    if name != b.manifest.board:
        raise BundleError(f"bundle {b.path} was compiled for board {b.manifest.board!r}, not {name!r}",
                          hint=f"compile it again with --board {name}")
    backend = backends.get(spec.backend)
    if backend.host_cpu and (options.get("emulate") or options.get("device")):
        raise InputError(f"--emulate/--device apply to accelerator boards; {name} runs on this host's CPU",
                         hint="drop the option, or open a bundle compiled for an accelerator board")
    module = backend.load("runtime")
    options = _checked_options(module.Runner, options, name)
    from edgehft.runtime.isolate import first_open
    from edgehft.runtime.plans import runner_plan
    if plan is None and b.manifest.plans and Path(path).resolve() != Path(path).absolute():
        b = load_bundle(Path(path).resolve(), verify=True)      # `current` read once: the record is that version's
    run_b, name, source = runner_plan(b, plan)
    first_open(run_b, spec, threads, options)  # a model that crashes LiteRT does so in a child, once per bundle
    runner = module.Runner(run_b, spec, threads=threads, affinity=affinity, **options)
    runner.plan, runner.plan_source = name, source
    return runner


def _checked_options(runner_type, options: dict, board: str) -> dict:
    """``options`` without the None-valued ones ``runner_type.__init__`` does not take; any other option it does
    not take is refused (a backend's ``Runner`` is constructed as ``Runner(bundle, board, threads=, affinity=,
    **options)``), before anything is opened.

    Raises:
        InputError: an option the board's runner does not take (exit 3; the hint lists the ones it does).
    """
    import inspect
    params = inspect.signature(runner_type.__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return options
    takes = [k for k, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY
             and k not in ("threads", "affinity")]
    unknown = sorted(k for k, v in options.items() if k not in takes and v is not None)
    if unknown:
        raise InputError(f"option {', '.join(unknown)} does not apply to board {board}",
                         hint=f"{board} takes {', '.join(takes) or 'no board options'}")
    return {k: v for k, v in options.items() if k in takes or v is not None}
