"""The backend registry (ground floor): a board's ``backend`` name -> the :class:`Backend` that serves it.

A backend is one contract per stage, each named by a module path and imported only when that stage runs,
so a lookup imports nothing heavy (no vendor library, no TensorFlow, no runtime):

- ``runtime``: the module holding the backend's ``Runner`` (a :class:`edgehft.runtime.base.Runner`);
- ``compiler``: ``"module:attribute"`` naming its compiler stage, the board-specific part of
  ``compile_model`` (see :class:`edgehft.compiler.stage.CompilerStage`);
- ``probe``: ``"module:function"``, ``probe(board, facts) -> list[str]``: why the box described by
  :func:`edgehft.deploy.probe.probe_box`'s ``facts`` is not ``board`` (empty when it is), run on the host;
- ``facts`` (optional): ``"module:function"``, ``facts(root: Path) -> dict``: what identifies its boards,
  read on the box under ``root`` and merged into ``probe_box``'s facts;
- ``partitioner`` (optional): ``"module:attribute"`` naming its partitioner, what ``edgehft report`` predicts for
  a model file and confirms for a bundle (see :class:`edgehft.partition.contract.Partitioner`);
- ``identity`` (optional): ``"module:function"``, ``identity(facts) -> list[str]``: the lines ``edgehft status``
  prints to say which of its boards the box is (empty when the facts show none);
- ``attached`` (optional): ``"module:function"``, ``attached() -> (dict, list[str])``: the accelerators of its
  kind attached to this machine, as JSON-ready data (merged into ``boards --probe --json``) and lines;
- ``board_options`` (optional): ``"module:attribute"`` naming its :class:`~edgehft.board_options.BoardOptions`,
  the command-line options only its boards take (added to ``compile`` and ``report``);
- ``compiled_model`` (optional): ``"module:function"``, ``(model: TFLiteModel) -> str | None``: what a model
  file was compiled for when it was compiled for its accelerator (``"the Edge TPU"``), else None: ``compile``
  refuses such a file, ``report`` shows it through ``compiled_report``;
- ``compiled_report`` (optional): ``"module:function"``, ``(model, path, cpu_model, as_json) -> bool``: shows a
  model file compiled for its accelerator (``report X_edgetpu.tflite``), False for any other model;
- ``commands`` (optional): ``"module:attribute"`` naming a list of click commands of its own, added to the
  ``edgehft`` command line (e.g. the jetson backend's ``build-engine``);
- ``isolate``: what its first open of a bundle runs in a child process (see :mod:`edgehft.runtime.isolate`);
- ``board_dirs``: extra directories of ``<name>.toml`` board files (a plugin ships its own boards).

The built-ins are ``cpu``, ``coral``, ``pynq`` and ``jetson``. Third-party backends come from the entry-point
group ``edgehft.backends``: the entry point's name is the backend name and its value
(``"module:attribute"``) names a :class:`Backend`, e.g. in a plugin's ``pyproject.toml``::

    [project.entry-points."edgehft.backends"]
    null = "null_board:BACKEND"

A built-in name cannot be taken by a plugin (the built-in wins). Runs on the box too: no new syntax.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from importlib import metadata

from edgehft.errors import BoardUnavailableError, InputError

GROUP = "edgehft.backends"


@dataclass(frozen=True)
class Backend:
    """One board kind's stages, each by module path (imported lazily, see :meth:`load`).

    Attributes:
        name: the ``backend`` field of the board TOMLs this backend serves.
        runtime: module holding ``Runner``.
        compiler: ``"module:attribute"`` of its compiler stage object.
        probe: ``"module:function"`` of its box probe, ``(board, facts: dict) -> list[str]``.
        facts: ``"module:function"``, ``(root: Path) -> dict`` of the facts its probe reads, or "" for none.
        host_cpu: the board runs on this host's CPU (``--emulate``/``--device`` do not apply to it).
        board_dirs: extra directories holding its ``<board>.toml`` files (absolute paths).
        golden_hint: the start of the hint when its runner does not reproduce the golden vectors (the
            golden path the bundle was made on follows it).
        partitioner: ``"module:attribute"`` of its :class:`~edgehft.partition.contract.Partitioner`, or "" for
            none (``report`` then predicts nothing for its boards and shows its bundles' reports as they are).
        identity: ``"module:function"``, ``(facts: dict) -> list[str]``: lines naming which of its boards the
            box described by ``facts`` is, or "" for none.
        attached: ``"module:function"``, ``() -> (dict, list[str])``: its accelerators attached here (data,
            lines) for ``edgehft boards --probe``, or "" for none.
        board_options: ``"module:attribute"`` of its :class:`~edgehft.board_options.BoardOptions`, or "" for none.
        compiled_model: ``"module:function"`` saying what a model file was compiled for, or "" for none.
        compiled_report: ``"module:function"`` showing a model compiled for its accelerator, or "" for none.
        commands: ``"module:attribute"`` of a list of its own click commands, or "" for none.
        isolate: what the first open of a bundle on this machine runs in an isolated child, a tuple of
            ``"runner"`` (the whole runner, always), ``"emulated"`` (the whole runner under ``emulate``) and
            ``"cpu_steps"`` (the LiteRT models of the bundle's ``steps.json`` that run on the CPU); None (the
            default): ``("runner",)`` when its ``Runner`` subclasses the cpu board's, else nothing.
    """

    name: str
    runtime: str
    compiler: str
    probe: str
    host_cpu: bool = False
    board_dirs: tuple = field(default_factory=tuple)
    golden_hint: str = "the interpreter path differs from the one that made the bundle: "
    facts: str = ""
    partitioner: str = ""
    isolate: tuple | None = None
    identity: str = ""
    attached: str = ""
    board_options: str = ""
    compiled_model: str = ""
    commands: str = ""
    compiled_report: str = ""

    def load(self, stage: str):
        """The object behind ``stage`` (``"runtime"``, ``"compiler"``, ``"probe"``, ``"facts"``, ``"partitioner"``,
        ``"identity"``, ``"attached"``, ``"board_options"`` or ``"compiled_report"``),
        imported now.

        Raises:
            BoardUnavailableError: the module or attribute is missing (the message names the backend).
        """
        return load_object(getattr(self, stage), f"backend {self.name!r} {stage}")


def _ref(module: str) -> str:
    return f"edgehft.{module}"


BUILTIN = {
    "cpu": Backend("cpu", _ref("runtime.cpu"), _ref("compiler.stage_cpu:STAGE"), _ref("deploy.probe_rules.cpu:probe"),
                   host_cpu=True, isolate=("runner",)),
    "coral": Backend("coral", _ref("runtime.coral"), _ref("compiler.stage_coral:STAGE"),
                     _ref("deploy.probe_rules.coral:probe"), facts=_ref("deploy.probe_rules.coral:facts"),
                     identity=_ref("deploy.probe_rules.coral:identity"),
                     attached=_ref("deploy.probe_rules.coral:attached"),
                     board_options=_ref("partition.coral_options:OPTIONS"),
                     compiled_model=_ref("partition.coral_compiled:compiled_for"),
                     compiled_report=_ref("cli.report_coral:show_compiled"),
                     partitioner=_ref("partition.coral:PARTITIONER"), isolate=("emulated",)),
    "pynq": Backend("pynq", _ref("runtime.pynq"), _ref("compiler.stage_pynq:STAGE"),
                    _ref("deploy.probe_rules.pynq:probe"), facts=_ref("deploy.probe_rules.pynq:facts"),
                    identity=_ref("deploy.probe_rules.pynq:identity"),
                    golden_hint="the overlay's kernels or the bundle's FPGA weights do not reproduce the golden path ",
                    partitioner=_ref("partition.pynq:PARTITIONER"), isolate=("emulated", "cpu_steps")),
    "jetson": Backend("jetson", _ref("runtime.jetson"), _ref("compiler.stage_jetson:STAGE"),
                      _ref("deploy.probe_rules.jetson:probe"), facts=_ref("deploy.probe_rules.jetson:facts"),
                      identity=_ref("deploy.probe_rules.jetson:identity"),
                      commands=_ref("cli.engine_jetson:COMMANDS"),
                      partitioner=_ref("partition.jetson:PARTITIONER"), isolate=()),
}


def load_object(ref: str, what: str):
    """Import ``ref`` (``"module"`` or ``"module:attribute"``) and return the module or attribute.

    Raises:
        BoardUnavailableError: the module or the attribute does not exist, or importing the module raised (a
            missing vendor library that the module imports at its top is reported the same way, naming it).
    """
    module, _, attr = ref.partition(":")
    try:
        obj = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        raise BoardUnavailableError(f"{what}: module {module} cannot be imported (no module {exc.name!r})",
                                    hint="install the package that provides it, or check its entry point") from None
    except Exception as exc:                       # a plugin's own bug at import: name the backend, no traceback
        raise BoardUnavailableError(f"{what}: importing {module} failed: {type(exc).__name__}: {exc}",
                                    hint="reinstall or fix the package that provides it") from None
    if not attr:
        return obj
    try:
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        raise BoardUnavailableError(f"{what}: {module} has no {attr!r}",
                                    hint="check the backend's entry point value (module:attribute)") from None
    return obj


def _entry_points() -> list:
    try:
        return list(metadata.entry_points(group=GROUP))
    except TypeError:                              # Python < 3.10: a dict of groups
        return list(metadata.entry_points().get(GROUP, []))


def _from_entry_point(ep) -> Backend:
    where = f"backend {ep.name!r} (entry point {ep.value} in group {GROUP})"
    try:
        obj = ep.load()
    except Exception as exc:                       # a plugin's own import error: say which plugin
        raise BoardUnavailableError(f"{where} failed to load: {type(exc).__name__}: {exc}",
                                    hint="reinstall or remove the package that provides it") from None
    if not isinstance(obj, Backend):
        raise BoardUnavailableError(f"{where} is a {type(obj).__name__}, not an edgehft.backends.Backend")
    if obj.name != ep.name:
        raise BoardUnavailableError(f"{where} names itself {obj.name!r}",
                                    hint="the entry point's name must be the Backend's name")
    return obj


def names() -> list[str]:
    """Every installed backend name: the built-ins, then the plugins' (sorted)."""
    extra = sorted({ep.name for ep in _entry_points()} - set(BUILTIN))
    return list(BUILTIN) + extra


def find(name: str) -> Backend | None:
    """The backend called ``name``, or None when none of that name is installed or its plugin fails to load."""
    try:
        return get(name)
    except BoardUnavailableError:
        return None


def get(name: str) -> Backend:
    """The backend called ``name`` (a board's ``backend`` field).

    Raises:
        BoardUnavailableError: no backend of that name is installed (the message lists the installed ones),
            or its plugin fails to load.
    """
    if name in BUILTIN:
        return BUILTIN[name]
    for ep in _entry_points():
        if ep.name == name:
            return _from_entry_point(ep)
    raise BoardUnavailableError(f"no backend {name!r} is installed",
                                hint=f"installed backends: {', '.join(names())}; a plugin registers one in the "
                                     f"entry-point group {GROUP}")


def plugin_board_dirs() -> list:
    """The board directories third-party backends ship, in backend-name order. A plugin that fails to load
    adds none (its boards are then unknown; :func:`get` says why)."""
    dirs = []
    for ep in sorted(_entry_points(), key=lambda e: e.name):
        if ep.name in BUILTIN:
            continue
        try:
            dirs += list(_from_entry_point(ep).board_dirs)
        except BoardUnavailableError:
            continue
    return dirs


def partitioner(name: str, required: bool = True):
    """The :class:`~edgehft.partition.contract.Partitioner` of backend ``name``; the base one (predicts nothing,
    confirms nothing) for a backend that names none, and, unless ``required``, for one not installed.

    Raises:
        BoardUnavailableError: no such backend (when ``required``), or its partitioner cannot be imported.
    """
    backend = get(name) if required else find(name)
    if backend is None or not backend.partitioner:      # by path like every stage: the registry imports none of what it names
        return load_object(_ref("partition.contract:NONE"), f"backend {name!r} partitioner")
    return backend.load("partitioner")


def _partitioners() -> list:
    """(backend name, partitioner) of every installed backend that names one and loads, in :func:`names` order."""
    found = []
    for name in names():
        b = find(name)
        if b is None or not b.partitioner:
            continue
        try:
            found.append((name, b.load("partitioner")))
        except BoardUnavailableError:
            continue
    return found


def stage_of_each(stage: str) -> list:
    """(backend name, loaded ``stage`` object) of every installed backend that names ``stage`` and whose object
    imports, in :func:`names` order: for the optional stages every board kind may answer (``"identity"``,
    ``"attached"``, ``"facts"``, ``"board_options"``)."""
    found = []
    for name in names():
        b = find(name)
        if b is None or not getattr(b, stage):
            continue
        try:
            found.append((name, b.load(stage)))
        except BoardUnavailableError:
            continue
    return found


def compiled_for(model) -> str | None:
    """What accelerator the TFLite ``model`` (:class:`~edgehft.ir.TFLiteModel`) was compiled for, as the first
    backend whose ``compiled_model`` recognises it says (``"the Edge TPU"``), or None for a plain model."""
    for _, check in stage_of_each("compiled_model"):
        what = check(model)
        if what:
            return what
    return None


def refuse_foreign_options(board, given: dict) -> None:
    """Refuse board options (``CompileOptions.board_options`` / what ``report`` got, keyed as the backends'
    :class:`~edgehft.board_options.BoardOptions` ``keys``) that ``board``'s own backend does not take.

    Raises:
        InputError: some ``given`` key belongs to another board kind (the message names its options and the
            boards they are for) or to none (exit 3).
    """
    mine = get(board.backend)
    own = set(mine.load("board_options").keys) if mine.board_options else set()
    foreign = set(given) - own
    if not foreign:
        return
    owners = [o for _, o in stage_of_each("board_options") if foreign & set(o.keys)]
    what = " and ".join(f"{o.spelled()} {'apply' if len(o.options) > 1 else 'applies'} to {o.owner} boards"
                        for o in owners) or f"board options {sorted(foreign)} do not apply"
    raise InputError(f"{what}, not {board.name}")


def default_board(suffix: str) -> str | None:
    """The board ``edgehft report MODEL`` predicts for when MODEL ends in ``suffix`` and no ``--board`` is given:
    the first backend's (in :func:`names` order, built-ins first) that declares one, or None."""
    for _, p in _partitioners():
        if suffix in p.default_boards:
            return p.default_boards[suffix]
    return None


def predicting(suffix: str) -> list:
    """The names of the installed backends whose partitioner predicts for model files ending in ``suffix``."""
    return [name for name, p in _partitioners() if suffix in p.suffixes]


def table_for_vendor(vendor: str) -> str | None:
    """The report layout (:data:`edgehft.report.TABLES` key) of the backend whose reports carry
    ``accelerator["vendor"] == vendor``, or None when no installed backend declares that tag."""
    if not vendor:
        return None
    for _, p in _partitioners():
        if p.vendor == vendor:
            return p.table
    return None
