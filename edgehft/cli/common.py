"""What every ``edgehft`` command shares: the ``main`` click group, the consoles, the error handler (an
:class:`~edgehft.errors.EdgeHFTError` becomes its message, hint and exit code), and the options defined
once and reused (``--json``, the runner options of ``run``/``bench``, the Edge TPU flags)."""
from __future__ import annotations

import functools
import json
import sys

import click
from rich.console import Console

from edgehft import __version__
from edgehft.errors import EdgeHFTError
from edgehft.report import printable

out = Console()
err = Console(stderr=True)


def _fail(exc: EdgeHFTError, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({"error": exc.args[0] if exc.args else str(exc), "type": type(exc).__name__,
                               "hint": exc.hint, "exit_code": exc.exit_code}))
    else:
        # one line each, never wrapped; text from bundles shown as text (no markup, no control codes)
        err.print(f"[bold red]error:[/] {printable(exc.args[0] if exc.args else exc)}", highlight=False,
                  soft_wrap=True)
        if exc.hint:
            err.print(f"  [yellow]hint:[/] {printable(exc.hint)}", highlight=False, soft_wrap=True)
    sys.exit(exc.exit_code)


def handles_errors(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except EdgeHFTError as exc:
            _fail(exc, kwargs.get("as_json", False))
    return wrapper


# Options defined once and shared.
json_opt = click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON on stdout.")
board_opt = click.option("--board", default=None, help="Board name (see `edgehft boards`); default: the bundle's.")
threads_opt = click.option("--threads", default=1, show_default=True, type=click.IntRange(min=1),
                           help="Interpreter threads.")
affinity_opt = click.option("--affinity", default=None,
                            help="Pin to these CPUs, e.g. '1' or '0,1' (os.sched_setaffinity).")
emulate_opt = click.option("--emulate", is_flag=True,
                           help="Accelerator boards: run on an emulation here (Coral: the int8 graph on LiteRT; "
                                "PYNQ: pynq's drivers against the emulated board); outputs checkable, timing not "
                                "the device's; the output says EMULATED.")


def _check_device(ctx, param, value):
    if value is None:
        return None
    from edgehft.errors import InputError
    from edgehft.runtime.coral_device import parse_device
    try:
        parse_device(value)
    except InputError as exc:
        raise click.BadParameter(exc.args[0]) from None
    return value


device_opt = click.option("--device", default=None, callback=_check_device,
                          help="Accelerator device, e.g. usb, usb:1, pci:0 (Edge TPU).")
overlay_opt = click.option("--overlay", default=None, type=click.Path(dir_okay=False),
                           help="PYNQ boards: the overlay's .bit (its .hwh next to it); default the board "
                                "file's [runtime] overlay_dir.")


def _board_option_sets(named: bool = False) -> list:
    """Every installed backend's :class:`~edgehft.board_options.BoardOptions` (with ``named``: (backend name,
    options) pairs), in backend order; a plugin whose options do not load adds none: its boards then take none."""
    from edgehft import backends
    try:
        found = backends.stage_of_each("board_options")
    except Exception:                       # a broken plugin metadata must not take the whole CLI down
        return []
    return found if named else [opts for _, opts in found]


def _click_option(o, backend: str):
    kinds = {"int": dict(type=click.IntRange(min=o.minimum)), "flag": dict(is_flag=True, default=None),
             "file": dict(type=click.Path(exists=True, dir_okay=False)), "text": {}}
    add = click.option(*o.flags, o.dest, help=o.help, **{"default": None, **kinds.get(o.kind, {})})

    def apply(fn):
        fn = add(fn)
        fn.__click_params__[-1].edgehft_backend = backend        # whose option: see drop_clashing_board_options
        return fn
    return apply


def board_opts(command: str):
    """Decorator: every backend's own options (:mod:`edgehft.board_options`) that ``command`` takes, in
    backend order; their values reach the command in its ``**board_values``. One that clashes with an option
    of the command is dropped when the CLI is assembled (:func:`drop_clashing_board_options`)."""
    def add(fn):
        for backend, opts in reversed(_board_option_sets(named=True)):
            for o in reversed(opts.options):
                if command in o.commands:
                    fn = _click_option(o, backend)(fn)
        return fn
    return add


def add_backend_commands(group: click.Group) -> list[str]:
    """Add every backend's own commands (its ``commands``, :mod:`edgehft.backends`) to ``group``; one whose name
    is taken (by edgehft's or an earlier backend's) is left out. Returns one warning per command left out
    (also written to stderr)."""
    from edgehft import backends
    warnings = []
    try:
        found = backends.stage_of_each("commands")
    except Exception:                       # broken plugin metadata must not take the whole CLI down
        return []
    for backend, commands in found:
        for cmd in commands:
            if cmd.name in group.commands:
                warnings.append(f"warning: backend {backend!r}'s command {cmd.name!r} clashes with "
                                f"`edgehft {cmd.name}` and is ignored (the backend must rename it)")
                continue
            group.add_command(cmd)
    for w in warnings:
        click.echo(w, err=True)
    return warnings


def drop_clashing_board_options(group: click.Group) -> list[str]:
    """Remove from every command of ``group`` the backends' options whose spelling or name is already taken
    (by edgehft's own options, then by an earlier backend's: built-ins first), so a plugin cannot shadow
    ``--timeout`` or Coral's ``-m``. Returns one warning per option dropped (also written to stderr)."""
    warnings = []
    for cmd in group.commands.values():
        own = [p for p in cmd.params if not getattr(p, "edgehft_backend", None)]
        taken = {n for p in own for n in (p.name, *p.opts, *p.secondary_opts)}
        keep = []
        for p in cmd.params:
            backend = getattr(p, "edgehft_backend", None)
            names = {p.name, *p.opts, *p.secondary_opts}
            if backend and names & taken:
                warnings.append(f"warning: backend {backend!r}'s option {'/'.join(p.opts)} clashes with another "
                                f"option of `edgehft {cmd.name}` and is ignored (the backend must rename it)")
                continue
            if backend:
                taken |= names
            keep.append(p)
        cmd.params[:] = keep
    for w in warnings:
        click.echo(w, err=True)
    return warnings


def board_options_of(values: dict) -> dict:
    """The ``board_options`` dict (``CompileOptions.board_options``, ``Partitioner.predict``) every backend
    makes of the raw option ``values`` a command received (``{dest: value or None}``).

    Raises:
        InputError: a value a backend cannot use (exit 3).
    """
    found = {}
    for opts in _board_option_sets():
        found.update(opts.collect(values))
    return found


def board_flags_given(values: dict) -> list:
    """The spellings of the board options the user gave, e.g. ``["-m", "-i"]``."""
    return [f for opts in _board_option_sets() for f in opts.given(values)]


def _keep_require_signature(ctx, param, value):
    ctx.meta["edgehft.require_signature"] = value       # read by open_runner (no parameter to thread through)


require_signature_opt = click.option(
    "--require-signature", "require_signature", type=click.Path(exists=True, dir_okay=False), default=None,
    expose_value=False, callback=_keep_require_signature, metavar="ALLOWED_SIGNERS",
    help="Open the bundle only if its manifest.json.sig verifies against this OpenSSH allowed_signers file "
         "(exit 6 if unsigned or signed by a key not listed there).")


def _keep_plan(ctx, param, value):
    ctx.meta["edgehft.plan"] = value                    # read by open_runner, like --require-signature


plan_opt = click.option(
    "--plan", "plan", default=None, expose_value=False, callback=_keep_plan, metavar="NAME",
    help="Run this execution plan of the bundle (a bundle compiled with --quant auto carries several; "
         "`edgehft report` lists them). Default: the plan recorded for this version on this box by `edgehft "
         "deploy`, else the bundle's top level (the compile host's choice). Unknown: exit 3.")


def select_opt(what: str):
    """``--select p50|p99|p99.9`` (default p99), the percentile execution plans are chosen by; ``what`` says
    where (the help text's end)."""
    from edgehft.runtime.plans import DEFAULT_SELECT, SELECTS
    return click.option("--select", "select", type=click.Choice(SELECTS), default=DEFAULT_SELECT,
                        show_default=True,
                        help="Percentile the execution plans are chosen by: the plan with the lowest one wins "
                             f"(ties: the lower p50); {what}.")


def runner_opts(fn):
    """What ``run`` and ``bench`` need to open a bundle: board, threads, affinity, emulate, device, overlay,
    --require-signature, --plan."""
    for opt in reversed((board_opt, threads_opt, affinity_opt, emulate_opt, device_opt, overlay_opt,
                         require_signature_opt, plan_opt)):
        fn = opt(fn)
    return fn


def open_runner(bundle, board, threads, affinity, emulate, device, overlay, as_json):
    """``runtime.open`` with the :func:`runner_opts` values (and ``--require-signature``, ``--plan`` from the
    click context); says EMULATED on stderr for people.

    Raises:
        EdgeHFTError: whatever :func:`edgehft.runtime.open` raises (bundle, board, signature, threads).
    """
    from edgehft import runtime
    opts = {k: v for k, v in (("overlay", overlay), ("emulate", emulate or None), ("device", device)) if v}
    ctx = click.get_current_context(silent=True)
    signers = ctx.meta.get("edgehft.require_signature") if ctx else None
    plan = ctx.meta.get("edgehft.plan") if ctx else None
    r = runtime.open(bundle, board, threads=threads, affinity=parse_affinity(affinity),
                     require_signature=signers, plan=plan, **opts)
    say_emulated(r, as_json)
    return r


ticks_opt = click.option("--ticks", "ticks", multiple=True, type=click.Path(exists=True, dir_okay=False),
                         help="Windows (.npy/.npz) or raw feed files for the bundle's feature pipeline "
                              "(with --run-features); repeat for several files, read as one stream.")
run_features_opt = click.option("--run-features", is_flag=True,
                                help="Make windows from raw feed files with the bundle's feature pipeline: Python "
                                     "code shipped in the bundle (hash-checked). Only for bundles you trust.")


def parse_affinity(text: str | None) -> list[int] | None:
    """``--affinity '0,1'`` as CPU ids ``[0, 1]`` (None when not given).

    Raises:
        click.BadParameter: not a comma-separated list of integers.
    """
    if text is None:
        return None
    try:
        ids = [int(c) for c in text.split(",") if c.strip()]
    except ValueError:
        ids = []
    if not ids or any(not 0 <= c < 1 << 16 for c in ids):
        raise click.BadParameter(f"--affinity {text!r}: expected CPU ids like '1' or '0,1'")
    return ids


def say_emulated(runner, as_json: bool) -> None:
    """One stderr line saying the runner is an emulation (people only: not with ``--json``)."""
    if runner.emulated and not as_json:
        note = runner.describe().get("note") or "an emulated board"
        err.print(f"[bold magenta]EMULATED[/] {runner.board}: {note}", highlight=False)


EXIT_CODES = ("Exit codes (every command): 0 ok, 1 a runner used wrongly (closed, or two threads at once), 2 usage, "
              "3 bad input (model, ticks, shapes, dtypes, NaN, an option the board does not take), 4 converter or "
              "vendor compiler failed, 5 drift gate failed (--strict), 6 not a bundle or it does not match its "
              "manifest, 7 board library or device unavailable, or an extra missing, 8 golden vectors not "
              "reproduced, 9 deploy refused or failed on the box (it keeps its previous version), 10 box unreachable, "
              "11 rollout stopped (--max-fail or its canary; the boxes not reached keep their version).")


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, epilog=EXIT_CODES)
@click.version_option(__version__, prog_name="edgehft")
def main() -> None:
    """Put trained Keras models on low-latency trading boards.

    \b
    Start here:
      edgehft compile examples/deeplob/deeplob.keras --board cpu --calib FEED.gz --out build/deeplob.cpu
      edgehft bench build/deeplob.cpu --run-features --ticks FEED.gz --samples 5000"""
