"""The bundle: a directory with ``manifest.json``, the model file(s), golden vectors and ``report.json``.

Ground floor: imports only the error types. Writing is atomic (a temporary sibling directory renamed
into place), so an interrupted compile never leaves a half bundle where a good one was. Loading checks
every file against the SHA-256 recorded in the manifest.

A bundle is untrusted input (it may come from anywhere, and it runs on boxes that trade). What loading
holds it to, each refusal a :class:`~edgehft.errors.BundleError` (exit 6) with a one-line message:

- the manifest is a JSON object of at most :data:`MAX_MANIFEST_BYTES`, UTF-8, a supported
  ``format_version`` (an integer, 1 up to :data:`FORMAT_VERSION`);
- every path it names (``files`` keys, ``model_file``, ``golden.file`` and each ``golden.sets`` file,
  ``features.file``, ``artifacts``)
  is a plain relative path inside the bundle (no ``..``, no absolute path, no empty or ``.`` part), and
  every one of them is listed in ``files`` with a SHA-256; so are ``report.json`` where present and every
  file a ``native.json`` or ``steps.json`` plan names (:data:`PLAN_FILE_KEYS`);
- a listed file is a regular file reached without a symlink (a symlink to anywhere, a directory, a FIFO
  are refused) and has its recorded hash (each file is read and hashed once);
- tensor specs have numpy dtype names, positive dims of sane size, and for quantized tensors a finite
  positive scale and a zero point within the dtype's range;
- golden vectors (checked when :meth:`Bundle.golden` reads them): at least one, a finite tolerance of sane
  size, an array for every input and output with the spec's dtype and ``(count, *shape[1:])``, finite
  values, a readable ``.npz`` without pickled objects.

- ``plans`` (a bundle that carries several execution plans): one entry without ``dir``, the manifest's own
  plan (the top level); each other entry's ``dir`` is exactly ``plans/<name>`` with its ``manifest.json``
  listed in ``files``; :meth:`Bundle.plan` opens that sub-bundle only if its manifest has the listed SHA-256,
  passes these same rules, carries no plans itself, has the top level's board, backend and I/O names and the
  plan's mode, and lists no file the top manifest does not list with the same SHA-256 (so verifying the top
  level verifies every plan, and a signature over it covers them all).

Readers open bundle files through :meth:`Bundle.resolve`, which refuses any path the manifest does not
list or that leaves the bundle. A tensor ``index`` is checked against the interpreter that opens the model
with :func:`check_io_details` (the manifest alone cannot know the model's tensors).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import stat
import struct
import tempfile
import zipfile
import zlib
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, Field, ValidationError

from edgehft.errors import BundleError

FORMAT = "edgehft-bundle"
FORMAT_VERSION = 4
# Format 2: the cpu board's native-bf16 plan (native.json steps conv2d / maxpool / concat / reshape). Format 3:
# the ONNX Runtime plans (ort-float, ort-int8: model_file is model.onnx). Format 4: a native-bf16 plan whose
# LSTM keeps its recurrent kernel in bf16 (native.json lstm steps' "recurrent": "bf16"; an older edgehft would
# run it in fp32 and miss the golden vectors). A bundle is written with the lowest format that describes it
# (:func:`format_version_for`), so boxes with an older edgehft still take the rest.
FORMAT_VERSION_FOR_PLAN = {"native-bf16": 2, "ort-float": 3, "ort-int8": 3}
FORMAT_VERSION_BF16_RECURRENT = 4
MANIFEST = "manifest.json"

# A cpu bundle may carry more than one plan: the top level is the compile host's choice (what every reader,
# old ones too, runs), each other plan a complete sub-bundle in plans/<name>/ whose files the top manifest
# also lists; the manifest's ``plans`` names them all. No format bump: an edgehft that does not know ``plans``
# ignores the field and runs the top level, as it always did. The box picks among them at deploy.
PLANS_DIR = "plans"
PLAN_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")
REPORT = "report.json"


def format_version_for(plan: str, files: dict | None = None) -> int:
    """The lowest bundle format that describes plan ``plan`` with its files (``files``: bundle path -> bytes or
    Path; its ``native.json``, where there is one, is read for LSTM steps with bf16 recurrent weights)."""
    version = FORMAT_VERSION_FOR_PLAN.get(plan, 1)
    native = (files or {}).get("native.json")
    if native is None:
        return version
    raw = native.read_bytes() if isinstance(native, Path) else native
    steps = json.loads(raw).get("steps", [])
    if any(st.get("kind") == "lstm" and st.get("recurrent") == "bf16" for st in steps):
        version = max(version, FORMAT_VERSION_BF16_RECURRENT)
    return version


MAX_MANIFEST_BYTES = 16 << 20          # a DeepLOB native-bf16 manifest is ~5 KiB; refused before reading it all
MAX_JSON_BYTES = 64 << 20              # report.json, native.json, steps.json
MAX_TENSOR_BYTES = 1 << 30             # one model input or output (DeepLOB's is 16 KB; a 224x224x3 image 600 KB)
MAX_GOLDEN_BYTES = 1 << 30             # all golden arrays together, as their headers declare them
MAX_RANK = 32                          # numpy 1.x's own limit on dimensions
# Files a native.json (cpu native plans) or steps.json (PYNQ) step names, by key: the runtimes open these.
PLAN_FILE_KEYS = ("model", "weights", "params")
PLAN_ARTIFACTS = ("native", "steps")
# Golden atol bound. The largest tolerance edgehft writes itself is 0.05 absolute (a Jetson int8 Q/DQ
# bundle, QDQ_GOLDEN_ATOL); the float plans write 2-4x a measured kernel-path difference, which is far below
# a tenth of the outputs' magnitude (float32 kernels differ in the last bits, bf16 by ~1e-2 relative at
# worst). A tolerance beyond max(0.05, 0.1 x max|golden output|) would pass outputs off by a tenth of their
# full scale, or (1e300) anything at all: a check that cannot fail. Such a bundle is refused.
ATOL_FLOOR = 0.05
ATOL_REL = 0.1
_QUANTIZED = ("int8", "uint8", "int16")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_NPZ_ERRORS = (zipfile.BadZipFile, zlib.error, struct.error, ValueError, OSError, EOFError, KeyError,
               MemoryError, NotImplementedError, RuntimeError, SyntaxError)
_RECOMPILE = "compile the bundle again (or copy the directory `edgehft compile --out` wrote again)"
_MAX_LISTED = 4                        # problems named in one message


class TensorSpec(BaseModel):
    """A model input or output: shape with batch, dtype, and for quantized tensors the affine
    parameters ``real = (q - zero_point) * scale`` (per tensor: lists of length 1)."""

    name: str
    index: int
    shape: list[int]
    dtype: str
    scale: list[float] | None = None
    zero_point: list[int] | None = None

    @property
    def quantized(self) -> bool:
        return self.scale is not None and self.dtype in _QUANTIZED


class SourceModel(BaseModel):
    """The model the bundle was compiled from: its file name (``file``), SHA-256 of its bytes (a SavedModel
    directory: of its files in order), Keras ``flavour`` (keras3 | tf-keras | saved-model) and ``lowering``
    (how the graph reached the TFLite converter, e.g. a tf-keras rebuild for a fused LSTM)."""

    file: str
    sha256: str
    flavour: str                      # keras3 | tf-keras | saved-model
    lowering: str                     # how the graph reached the TFLite converter


class Quantization(BaseModel):
    """How the bundle's model was quantized: the plan ``mode``; the calibration set's fingerprint
    (``calibration_sha256`` over dtype, shape and bytes of the windows, :func:`sha256_arrays`), its size in
    windows and the files it came from (``calibration_source``, recorded for people: nothing on a box reads
    them); and how many held-out windows the drift figures used."""

    mode: Literal["int8", "dynamic", "fp16", "float", "native", "native-bf16", "ort-float", "ort-int8"]
    calibration_sha256: str | None = None
    calibration_windows: int = 0
    calibration_source: list[str] = Field(default_factory=list)
    drift_windows: int = 0


class GoldenSet(BaseModel):
    """The golden outputs another TFLite interpreter release computes for the same golden inputs (issue 18: a
    PYNQ-Z2 runs tflite-runtime 2.14.0, whose int8 kernels give other results than the compile host's
    ai-edge-litert): ``outputs/<name>`` arrays in ``file`` (npz, raw dtypes, the inputs are the default set's),
    made by ``reference_path`` (``"tflite-runtime 2.14.0 BUILTIN+XNNPACK"``, what a runner of that release
    reports) in the side Python that ``made_by`` describes (Python version, machine, edgehft version, whether
    the accelerator was emulated). A box whose runner reports ``reference_path`` is checked against this set."""

    file: str
    reference_path: str
    made_by: str = ""


class Golden(BaseModel):
    """Golden vectors: ``inputs/<name>`` and ``outputs/<name>`` arrays in ``file`` (npz), raw dtypes.

    ``reference_path`` names the interpreter path that produced the outputs; ``compare`` is ``exact``
    for integer outputs and ``allclose`` (with ``atol``) for float ones. ``sets``: the outputs other
    interpreter releases compute for the same inputs (:class:`GoldenSet`, one per release; written only when
    there are any, and an edgehft that does not know them checks every box against ``file``'s outputs).
    """

    file: str = "golden.npz"
    count: int
    reference_path: str
    compare: Literal["exact", "allclose"]
    atol: float = 0.0
    sets: list[GoldenSet] = Field(default_factory=list)


class Features(BaseModel):
    """The model's feature pipeline, copied into the bundle: ``file`` relative to the bundle."""

    file: str
    callable: str


class PlanEntry(BaseModel):
    """One execution plan a bundle carries (``Manifest.plans``, keyed by the plan's name, its quantization
    mode): ``dir`` its sub-bundle (``plans/<name>``; None: the bundle's top level, the compile host's
    choice), its drift against the float model (``drift_rel_mae``: the worst output's relative MAE, None
    without a float reference; ``drift_passed``) and what the compile host measured (``compile_host``:
    ``p50_us``, ``p99_us``, ``p99.9_us``, ``mean_us`` in µs; empty when it did not time the plans)."""

    dir: str | None = None
    drift_rel_mae: float | None = None
    drift_passed: bool | None = None
    compile_host: dict[str, float] = Field(default_factory=dict)


class Manifest(BaseModel):
    """``manifest.json``, the bundle's contract with every box: format and version, the board and backend it
    was compiled for, ``model_file`` (the int8/float TFLite IR; ``model.onnx`` for the ONNX Runtime plans),
    where the model came from (:class:`SourceModel`) and how it was quantized (:class:`Quantization`), the I/O tensors
    (:class:`TensorSpec`), the golden vectors (:class:`Golden`), the feature pipeline (:class:`Features`),
    toolchain versions, board-specific ``artifacts`` and ``accelerator`` needs, and ``files``: the SHA-256 of
    every other file, which is what a signature over the manifest covers; ``plans`` (:class:`PlanEntry`), when
    the bundle carries more than one execution plan (the top level and ``plans/<name>/`` sub-bundles, see
    :meth:`Bundle.plan`). :func:`load_bundle` refuses a manifest that breaks any rule of :func:`check_manifest`."""

    format: str = FORMAT
    format_version: int = 1
    created_utc: str = Field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    board: str
    backend: str
    model_file: str
    source: SourceModel
    quantization: Quantization
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    golden: Golden | None = None
    features: Features | None = None
    toolchain: dict[str, str] = Field(default_factory=dict)
    # Board-specific artifacts next to the int8 IR, by role, e.g. {"edgetpu_model": "model_edgetpu.tflite"}
    # (the Edge TPU compiler's output) -- relative paths, also listed in ``files``.
    artifacts: dict[str, str] = Field(default_factory=dict)
    # What the accelerator needs at run time, e.g. {"min_runtime_version": 14, "compiler_version": "16.0…"}.
    accelerator: dict = Field(default_factory=dict)
    files: dict[str, str] = Field(default_factory=dict)    # relative path -> sha256 (all but manifest)
    # The plans the bundle carries, by name ({} for a bundle of one plan; written only when not empty).
    plans: dict[str, PlanEntry] = Field(default_factory=dict)


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sha256_arrays(*arrays: np.ndarray) -> str:
    """SHA-256 over dtype, shape and bytes of each array (a calibration-set fingerprint)."""
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _err(where, what: str, hint: str | None = _RECOMPILE) -> BundleError:
    """A BundleError ``bundle WHERE: WHAT`` on one line (names from the bundle may hold newlines)."""
    msg = f"bundle {where}: {what}".replace("\r", "\\r").replace("\n", "\\n")
    return BundleError(msg, hint=hint)


def _joined(problems: list[str]) -> str:
    more = len(problems) - _MAX_LISTED
    return "; ".join(problems[:_MAX_LISTED]) + (f"; and {more} more" if more > 0 else "")


def _short(value, n: int = 60) -> str:
    r = repr(value)
    return r if len(r) <= n else r[:n] + "…"


def _open_regular(path: Path):
    """``path`` opened for binary reading if it is a regular file, never following a symlink and never
    blocking (a FIFO); ``(file, None)`` or ``(None, why)``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None, "missing"
    except OSError as exc:
        if os.path.islink(path):
            return None, "is a symlink (a bundle holds plain files only)"
        return None, f"cannot be opened ({exc.strerror or exc})"
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        return None, f"is {_kind(mode)}, not a regular file"
    return os.fdopen(fd, "rb"), None


def _kind(mode: int) -> str:
    return "a directory" if stat.S_ISDIR(mode) else "a symlink" if stat.S_ISLNK(mode) else \
        "a FIFO, socket or device"


def _read_json(where, path: Path, rel: str, limit: int):
    """The JSON value in ``path``: a regular file of at most ``limit`` bytes, UTF-8, nested sanely.

    Raises:
        BundleError: anything else, naming ``rel``.
    """
    fh, why = _open_regular(path)
    if fh is None:
        raise _err(where, f"{rel} {why}")
    with fh:
        size = os.fstat(fh.fileno()).st_size
        if size > limit:
            raise _err(where, f"{rel} is {size:,} B, more than the {limit:,} B a bundle's {rel} may hold")
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise _err(where, f"{rel} is more than the {limit:,} B a bundle's {rel} may hold")
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise _err(where, f"{rel} is not UTF-8 text (byte {exc.start})") from None
    except RecursionError:
        raise _err(where, f"{rel} is nested too deeply to be a bundle's {rel}") from None
    except ValueError as exc:               # json.JSONDecodeError, and integers over Python's digit limit
        raise _err(where, f"{rel} is not valid JSON: {exc}") from None


def _path_problem(rel) -> str | None:
    """Why ``rel`` is not a plain relative path inside a bundle (``a/b.bin``), or None."""
    if not isinstance(rel, str) or not rel:
        return "is empty"
    if "\\" in rel or any(ord(c) < 32 or ord(c) == 127 for c in rel):
        return "holds a backslash or a control character"
    if rel.startswith("/"):
        return "is an absolute path"
    if any(p in ("", ".", "..") for p in rel.split("/")):
        return "is not a plain relative path inside the bundle (an empty, '.' or '..' part)"
    if rel == MANIFEST:
        return "is the manifest itself"
    return None


def _named_paths(m: Manifest) -> list[tuple[str, str]]:
    """``(field, path)`` for every path the manifest names besides its ``files`` keys."""
    named = [("model_file", m.model_file)]
    if m.golden is not None:
        named.append(("golden.file", m.golden.file))
        named += [(f"golden.sets[{k}].file", gs.file) for k, gs in enumerate(m.golden.sets)]
    if m.features is not None and m.features.file:        # "" is a module reference, no file
        named.append(("features.file", m.features.file))
    named += [(f"artifacts.{role}", rel) for role, rel in sorted(m.artifacts.items())]
    return named


def _path_problems(m: Manifest) -> list[str]:
    if not m.files:
        return ["its manifest lists no files (files is empty), so nothing in it is verified"]
    problems = []
    for rel, digest in sorted(m.files.items()):
        why = _path_problem(rel)
        if why:
            problems.append(f"files key {_short(rel)} {why}")
        elif not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            problems.append(f"files[{rel!r}] is not a SHA-256 (64 lowercase hex digits): {_short(digest)}")
    for field, rel in _named_paths(m):
        why = _path_problem(rel)
        if why:
            problems.append(f"{field} {_short(rel)} {why}")
        elif rel not in m.files:
            problems.append(f"{field} {rel} is not listed in files (no SHA-256 covers it)")
    return problems


def _spec_problems(role: str, s: TensorSpec) -> list[str]:
    where = f"{role} {s.name!r}"
    if s.index < 0:
        return [f"{where}: tensor index {s.index} is negative"]
    try:
        dt = np.dtype(s.dtype)
    except (TypeError, ValueError, SyntaxError):
        return [f"{where}: dtype {_short(s.dtype)} is not a numpy dtype"]
    if dt.name != s.dtype or dt.kind not in "biufc":
        return [f"{where}: dtype {_short(s.dtype)} is not a numeric numpy dtype name (e.g. float32, int8)"]
    if len(s.shape) > MAX_RANK or any(d < 1 for d in s.shape):
        return [f"{where}: shape {_short(s.shape)} needs at most {MAX_RANK} dimensions, each at least 1"]
    nbytes = math.prod(s.shape) * dt.itemsize
    if nbytes > MAX_TENSOR_BYTES:
        return [f"{where}: shape {_short(s.shape)} is {nbytes:,} B, more than the {MAX_TENSOR_BYTES:,} B "
                "a model input or output may hold"]
    if not s.quantized:
        return []
    if len(s.scale) != 1 or s.zero_point is None or len(s.zero_point) != 1:
        return [f"{where}: quantized {s.dtype} needs one scale and one zero_point (per tensor), not "
                f"scale {_short(s.scale)} and zero_point {_short(s.zero_point)}"]
    problems = []
    if not (math.isfinite(s.scale[0]) and s.scale[0] > 0):
        problems.append(f"{where}: scale {s.scale[0]!r} is not a finite positive number")
    info = np.iinfo(dt)
    if not info.min <= s.zero_point[0] <= info.max:
        problems.append(f"{where}: zero_point {s.zero_point[0]} is outside {s.dtype}'s range "
                        f"{info.min}..{info.max}")
    return problems


def _io_problems(m: Manifest) -> list[str]:
    problems = []
    for role, specs in (("input", m.inputs), ("output", m.outputs)):
        if not specs:
            problems.append(f"the manifest names no {role}s")
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            problems.append(f"two {role}s share a name: {_short(names)}")
        for s in specs:
            problems += _spec_problems(role, s)
    return problems


def _golden_problems(m: Manifest) -> list[str]:
    g = m.golden
    if g is None:
        return []
    problems = []
    if g.count < 1:
        problems.append(f"golden count {g.count}: a bundle carries at least one golden vector (0 checks nothing)")
    if not (math.isfinite(g.atol) and g.atol >= 0):
        problems.append(f"golden atol {g.atol!r} is not a finite number >= 0")
    paths = [g.reference_path] + [gs.reference_path for gs in g.sets]
    files = [g.file] + [gs.file for gs in g.sets]
    if len(set(paths)) != len(paths) or len(set(files)) != len(files):
        problems.append("golden sets: two sets name the same interpreter path or file (which one a box is "
                        "checked against would be ambiguous)")
    if problems:
        return problems
    try:
        per_vector = sum(math.prod(s.shape[1:]) * np.dtype(s.dtype).itemsize for s in m.inputs + m.outputs)
    except TypeError:
        return []                             # a dtype problem, named by _io_problems
    if g.count * per_vector * (1 + len(g.sets)) > MAX_GOLDEN_BYTES:
        problems.append(f"golden count {g.count} makes {g.count * per_vector:,} B of golden vectors, more than "
                        f"{MAX_GOLDEN_BYTES:,} B")
    return problems


def _finite_or_none(x) -> bool:
    return x is None or (not isinstance(x, bool) and math.isfinite(x))


def _plans_problems(m: Manifest) -> list[str]:
    """What is wrong with ``m.plans``: names, one top-level entry that is the manifest's own plan, each other
    entry's ``dir`` exactly ``plans/<name>`` with its manifest listed in ``files``, finite figures."""
    if not m.plans:
        return []
    problems = []
    tops = [n for n, e in m.plans.items() if e.dir is None]
    if tops != [m.quantization.mode]:
        problems.append(f"plans names {_short(tops)} as the top level (dir null); it must be the manifest's own plan "
                        f"{m.quantization.mode!r}, once")
    for name, e in m.plans.items():
        if not isinstance(name, str) or not PLAN_NAME.fullmatch(name):
            problems.append(f"plan name {_short(name)} is not a plan name (lowercase letters, digits, '-')")
            continue
        if e.dir is not None and e.dir != f"{PLANS_DIR}/{name}":
            problems.append(f"plans[{name!r}].dir is {_short(e.dir)}, not {PLANS_DIR}/{name}")
        elif e.dir is not None and f"{e.dir}/{MANIFEST}" not in m.files:
            problems.append(f"plans[{name!r}]: {e.dir}/{MANIFEST} is not listed in files (no SHA-256 covers it)")
        bad = [k for k, v in e.compile_host.items() if not (_finite_or_none(v) and v is not None and v >= 0)]
        if bad or not _finite_or_none(e.drift_rel_mae):
            problems.append(f"plans[{name!r}] has a figure that is not a finite number >= 0: "
                            f"{_short(bad or e.drift_rel_mae)}")
    return problems


def check_manifest(m: Manifest, where="<manifest>") -> None:
    """Check a parsed manifest against the rules in the module docstring that need no file: paths, the
    ``files`` map's coverage, tensor specs, golden count and tolerance, the ``plans`` entries.

    Raises:
        BundleError: naming the problems found (up to four, on one line).
    """
    problems = _path_problems(m) + _io_problems(m) + _golden_problems(m) + _plans_problems(m)
    if problems:
        raise _err(where, "its manifest is refused: " + _joined(problems))


def check_io_details(specs: list[TensorSpec], details: list[dict], role: str, model: str | Path) -> None:
    """Check the manifest's ``specs`` against an interpreter's ``details`` (LiteRT's
    ``get_input_details()`` or ``get_output_details()``: dicts with ``index``, ``shape``, ``dtype``): each
    spec's ``index`` is one of the interpreter's ``role`` tensors ("input" or "output"), with the spec's
    shape and dtype. ``model`` (the model file's path) names it in the message. Call it after the
    interpreter is made and before any ``set_tensor`` or ``tensor()``.

    Raises:
        BundleError: a tensor index the model does not have as that role, or a shape or dtype that differs.
    """
    by_index = {int(d["index"]): d for d in details}
    for s in specs:
        d = by_index.get(s.index)
        if d is None:
            what = (f"the manifest's {role} {s.name!r} is tensor {s.index}, which is not an {role} of the model "
                    f"(its {role}s are tensors {_short(sorted(by_index))})")
        else:
            shape = tuple(int(x) for x in d["shape"])
            if shape == tuple(s.shape) and np.dtype(d["dtype"]) == np.dtype(s.dtype):
                continue
            what = (f"the manifest's {role} {s.name!r} is {s.dtype} {tuple(s.shape)}, the model's tensor "
                    f"{s.index} is {np.dtype(d['dtype']).name} {shape}")
        raise BundleError(f"{model}: {what}".replace("\n", "\\n"), hint=_RECOMPILE)


class Bundle:
    """An opened bundle directory (``manifest`` parsed; files verified unless ``verify=False``).

    A Bundle made directly (the compiler's draft, whose ``files`` map is still empty) skips the "listed in
    ``files``" rule of :meth:`resolve`; :func:`load_bundle` refuses a manifest with an empty ``files``."""

    def __init__(self, path: Path, manifest: Manifest):
        self.path = path
        self.manifest = manifest
        self._root = os.path.realpath(path)

    def resolve(self, rel: str) -> Path:
        """The path of bundle file ``rel`` (``"native/op3.npz"``), for reading it.

        Raises:
            BundleError: ``rel`` is not a plain relative path, not listed in the manifest's ``files``, missing,
                a symlink, not a regular file, or reached through a symlinked directory.
        """
        why = self._file_problem(rel)
        if why:
            raise _err(self.path, why)
        return self.path / rel

    def file(self, rel: str) -> Path:
        """Same as :meth:`resolve`."""
        return self.resolve(rel)

    def _file_problem(self, rel) -> str | None:
        why = _path_problem(rel)
        if why:
            return f"{_short(rel)} {why}"
        if self.manifest.files and rel not in self.manifest.files:
            return f"{rel} is not listed in the manifest's files"
        p = self.path / rel
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            return f"missing {rel}"
        except OSError as exc:
            return f"{rel} cannot be read ({exc.strerror or exc})"
        if stat.S_ISLNK(st.st_mode):
            return f"{rel} is a symlink (a bundle holds plain files only)"
        if not stat.S_ISREG(st.st_mode):
            return f"{rel} is {_kind(st.st_mode)}, not a regular file"
        if os.path.realpath(p) != os.path.join(self._root, rel):
            return f"{rel} is reached through a symlinked directory"
        return None

    @property
    def model_path(self) -> Path:
        return self.resolve(self.manifest.model_file)

    def report(self) -> dict:
        """``report.json`` as a dict ({} where the bundle has none).

        Raises:
            BundleError: it is unlisted, changed in kind (symlink, directory), too large, not UTF-8 JSON, or
                not a JSON object.
        """
        if REPORT not in self.manifest.files and not os.path.lexists(self.path / REPORT):
            return {}
        data = _read_json(self.path, self.resolve(REPORT), REPORT, MAX_JSON_BYTES)
        if not isinstance(data, dict):
            raise _err(self.path, f"{REPORT} is a JSON {type(data).__name__}, not an object")
        return data

    def require_golden(self) -> Golden:
        """The manifest's golden vectors (their spec; nothing is read).

        Raises:
            BundleError: the bundle has none, saying why where its report does (compile could not make
                them: a custom op that no LiteRT kernel path runs, an input batch other than 1).
        """
        if self.manifest.golden is not None:
            return self.manifest.golden
        try:
            why = str(self.report().get("golden", {}).get("missing") or "")
        except (BundleError, AttributeError, ValueError, OSError):      # a damaged report.json: no reason
            why = ""
        if not why:
            raise BundleError(f"bundle {self.path} has no golden vectors", hint="compile it again")
        raise BundleError(f"bundle {self.path} has no golden vectors, so nothing can check its outputs: compile "
                          f"could not make them ({' '.join(why.split())[:300].rstrip('.')})",
                          hint=f"`edgehft report {self.path}` shows the partition and why; deploy a bundle that "
                               "has golden vectors, or check this model's outputs on the box another way")

    def golden_set(self, path: str | None) -> GoldenSet | None:
        """The golden set (:class:`GoldenSet`) made by the interpreter path ``path`` (e.g. ``"tflite-runtime
        2.14.0 BUILTIN+XNNPACK"``, what a runner's ``describe()`` reports), or None: the default set (``golden.file``,
        made by ``golden.reference_path``) is the one to check against. Nothing is read.

        Raises:
            BundleError: the bundle has no golden vectors (:meth:`require_golden`).
        """
        g = self.require_golden()
        return next((gs for gs in g.sets if path and gs.reference_path == path), None)

    def golden(self, path: str | None = None) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """``(inputs, outputs)`` golden arrays by tensor name, each ``(count, *spec.shape[1:])`` in the spec's
        dtype, finite. ``path``: the interpreter path that will be checked; where the bundle carries a set made
        by it (:meth:`golden_set`), the outputs are that set's, else the default set's.

        Raises:
            BundleError: no golden vectors; golden.npz (or the set's file) unreadable (truncated, damaged, not an
                .npz, pickled objects), an input or output without its array, an array of the wrong shape or
                dtype, NaN or inf values, or an ``atol`` above :data:`ATOL_FLOOR` and :data:`ATOL_REL` x
                max|output|.
        """
        g = self.require_golden()
        ins, outs = _read_golden(self.path, self.resolve(g.file), self.manifest)
        chosen = self.golden_set(path)
        if chosen is not None:
            _, outs = _read_golden(self.path, self.resolve(chosen.file), self.manifest, chosen.file, ("outputs",))
        _check_golden_values(self.path, self.manifest, ins, outs)
        return ins, outs

    def verify(self) -> None:
        """Check every file listed in the manifest is a regular file inside the bundle with its recorded
        SHA-256 (each read once), that ``report.json`` is listed where present, and that every file a
        ``native.json``/``steps.json`` plan names is listed.

        Raises:
            BundleError: naming each missing, changed or refused file.
        """
        problems = []
        for rel, digest in sorted(self.manifest.files.items()):
            why = self._file_problem(rel)
            if why:
                problems.append(why)
                continue
            got, why = _sha256_nofollow(self.path / rel)
            if why:
                problems.append(f"{rel} {why}")
            elif got != digest:
                problems.append(f"{rel} changed (sha256 {got[:12]}…, manifest says {digest[:12]}…)")
        if problems:
            msg = f"bundle {self.path} does not match its manifest: " + _joined(problems)
            raise BundleError(msg.replace("\r", "\\r").replace("\n", "\\n"),
                              hint="the bundle was modified or truncated after compile; compile or copy it again")
        if REPORT not in self.manifest.files and os.path.lexists(self.path / REPORT):
            raise _err(self.path, f"{REPORT} is in the bundle but not listed in its manifest's files")
        self._verify_plans()
        for name in self.manifest.plans:
            if self.manifest.plans[name].dir is not None:
                self.plan(name)._verify_plans()

    def plan_names(self) -> list[str]:
        """The execution plans this bundle carries, the top level's first (a bundle of one plan: its mode)."""
        top = self.manifest.quantization.mode
        return [top] + [n for n in self.manifest.plans if n != top]

    def plan(self, name: str) -> "Bundle":
        """Plan ``name`` as a bundle of its own: this bundle for its top-level plan, else the sub-bundle in
        ``plans/<name>/`` (its files already verified with this bundle's: each is listed in both manifests
        with one SHA-256).

        Raises:
            InputError: the bundle carries no plan of that name (exit 3; the message lists its plans).
            BundleError: the sub-bundle's manifest is missing, changed, malformed, or disagrees with the top
                level (another board, backend, plan or I/O names; a file the top manifest does not list with
                the same SHA-256; plans of its own).
        """
        if name == self.manifest.quantization.mode:
            return self
        entry = self.manifest.plans.get(name) if isinstance(name, str) else None
        if entry is None or entry.dir is None:
            from edgehft.errors import InputError
            raise InputError(f"bundle {self.path} has no plan {name!r}; its plans: {', '.join(self.plan_names())}",
                             hint="pass one of those plans, or none for the one chosen for this box")
        rel = f"{entry.dir}/{MANIFEST}"
        got, why = _sha256_nofollow(self.resolve(rel))
        if why or got != self.manifest.files[rel]:
            raise _err(self.path, f"{rel} {why or 'changed'} (its SHA-256 is not the one the manifest lists)")
        root = self.path / entry.dir
        sub = Bundle(root, _parse_manifest(root, root / MANIFEST))
        check_manifest(sub.manifest, root)
        problems = _sub_problems(self.manifest, sub.manifest, name)
        if problems:
            raise _err(self.path, f"plan {name} ({entry.dir}) disagrees with the bundle: " + _joined(problems))
        return sub

    def _verify_plans(self) -> None:
        """Every file a ``native.json`` or ``steps.json`` step names (:data:`PLAN_FILE_KEYS`) is listed."""
        for role in PLAN_ARTIFACTS:
            rel = self.manifest.artifacts.get(role)
            if not rel:
                continue
            plan = _read_json(self.path, self.resolve(rel), rel, MAX_JSON_BYTES)
            steps = plan.get("steps") if isinstance(plan, dict) else None
            if not isinstance(steps, list) or not all(isinstance(st, dict) for st in steps):
                raise _err(self.path, f"{rel} is not a plan (an object whose steps are a list of objects)")
            problems = []
            for k, st in enumerate(steps):
                for key in PLAN_FILE_KEYS:
                    if key in st:
                        why = _path_problem(st[key])
                        if why or st[key] not in self.manifest.files:
                            problems.append(f"step {k} {key} {_short(st[key])} "
                                            f"{why or 'is not listed in the manifest files'}")
            if problems:
                raise _err(self.path, f"{rel} names files the manifest does not cover: " + _joined(problems))


def _sub_problems(top: Manifest, sub: Manifest, name: str) -> list[str]:
    """Why the sub-bundle manifest ``sub`` of plan ``name`` cannot be a plan of ``top``."""
    problems = []
    if sub.plans:
        problems.append("it lists plans of its own (plans do not nest)")
    for field in ("board", "backend"):
        if getattr(sub, field) != getattr(top, field):
            problems.append(f"its {field} is {_short(getattr(sub, field))}, the bundle's {_short(getattr(top, field))}")
    if sub.quantization.mode != name:
        problems.append(f"its quantization mode is {sub.quantization.mode!r}")
    for role in ("inputs", "outputs"):
        if [s.name for s in getattr(sub, role)] != [s.name for s in getattr(top, role)]:
            problems.append(f"its {role} are not the bundle's")
    base = f"{PLANS_DIR}/{name}"
    unlisted = sorted(rel for rel, d in sub.files.items() if top.files.get(f"{base}/{rel}") != d)
    if unlisted:
        problems.append("files the bundle's manifest does not list with the same SHA-256: " + _short(unlisted, 120))
    return problems


def _sha256_nofollow(path: Path) -> tuple[str, str | None]:
    """``(hexdigest, None)`` of a regular file read once without following a symlink, or ``("", why)``."""
    fh, why = _open_regular(path)
    if fh is None:
        return "", why
    h = hashlib.sha256()
    with fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest(), None


def _npy_header(z, key: str) -> tuple[tuple, np.dtype, int]:
    """``(shape, dtype, data bytes)`` of member ``key`` of the open npz ``z``, from its header alone."""
    member = key + ".npy" if key + ".npy" in z.zip.namelist() else key
    info = z.zip.getinfo(member)
    with z.zip.open(member) as fh:
        version = np.lib.format.read_magic(fh)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(fh)
        elif version == (2, 0):
            shape, _, dtype = np.lib.format.read_array_header_2_0(fh)
        else:
            raise ValueError(f"npy format version {version[0]}.{version[1]}")
        return tuple(shape), dtype, info.file_size - fh.tell()


def _read_golden(where, path: Path, m: Manifest, rel: str | None = None,
                 parts: tuple = ("inputs", "outputs")) -> tuple[dict, dict]:
    """The golden arrays of ``m``'s inputs and outputs (``parts``: only those) from ``path`` (the bundle's
    ``rel``, default ``golden.file``), each checked from its header (dtype, shape, size) before its data is
    read."""
    g = m.golden
    rel = rel or g.file
    try:
        z = np.load(path, allow_pickle=False)
    except _NPZ_ERRORS as exc:
        raise _err(where, f"{rel} cannot be read ({type(exc).__name__}: {_short(str(exc), 120)})") from None
    if isinstance(z, np.ndarray):
        raise _err(where, f"{rel} is a single .npy array, not an .npz of inputs/ and outputs/ arrays")
    members = z.zip.namelist()
    stems = [n[:-4] for n in members if n.endswith(".npy")]
    if len(stems) != len(members) or len(set(stems)) != len(stems):
        odd = sorted({n for n in members if not n.endswith(".npy")} | {n for n in stems if stems.count(n) > 1})
        z.close()
        raise _err(where, f"{rel} holds members that are not .npy arrays, or are named twice: "
                          f"{_short(', '.join(odd), 120)}")
    ins, outs = {}, {}
    try:
        with z:
            for prefix, specs, into in (("inputs", m.inputs, ins), ("outputs", m.outputs, outs)):
                for s in (specs if prefix in parts else []):
                    key = f"{prefix}/{s.name}"
                    if key not in z.files:
                        raise _err(where, f"{rel} has no array {key} (the manifest's {prefix[:-1]} {s.name!r})")
                    shape, dtype, data_bytes = _npy_header(z, key)
                    _check_header(where, rel, key, s, g.count, shape, dtype, data_bytes)
                    into[s.name] = z[key]
    except _NPZ_ERRORS as exc:
        raise _err(where, f"{rel} cannot be read ({type(exc).__name__}: {_short(str(exc), 120)})") from None
    return ins, outs


def _check_header(where, rel: str, key: str, s: TensorSpec, count: int, shape: tuple, dtype: np.dtype,
                  data_bytes: int) -> None:
    if dtype.hasobject:
        raise _err(where, f"{rel} {key} holds Python objects (pickled data); golden vectors are plain arrays")
    want_dt = np.dtype(s.dtype)
    if dtype != want_dt:
        cast = (" (a cast would change its values, e.g. turn float64 beyond float32's range into inf)"
                if dtype.kind == want_dt.kind == "f" else "")
        raise _err(where, f"{rel} {key} is {dtype.str} ({dtype.name}), the tensor is {want_dt.name}{cast}")
    want = (count, *s.shape[1:])
    if shape != want:
        raise _err(where, f"{rel} {key} has shape {shape}, expected {want} (golden count {count}, tensor shape "
                          f"{tuple(s.shape)})")
    if math.prod(shape) * dtype.itemsize != data_bytes:
        raise _err(where, f"{rel} {key} holds {data_bytes:,} B of data, its header says "
                          f"{math.prod(shape) * dtype.itemsize:,} B (truncated or damaged)")


def _check_golden_values(where, m: Manifest, ins: dict, outs: dict) -> None:
    g = m.golden
    for prefix, arrays in (("inputs", ins), ("outputs", outs)):
        for name, a in arrays.items():
            if a.dtype.kind in "fc" and not np.isfinite(a).all():
                raise _err(where, f"{g.file} {prefix}/{name} holds {int((~np.isfinite(a)).sum())} NaN or inf "
                                  "values (a golden vector must be reproducible)")
    if g.compare != "allclose":
        return
    peak = max((float(np.abs(a.astype(np.float64)).max()) for a in outs.values() if a.size), default=0.0)
    bound = max(ATOL_FLOOR, ATOL_REL * peak)
    if g.atol > bound:
        raise _err(where, f"golden atol {g.atol:g} is larger than max({ATOL_FLOOR:g}, {ATOL_REL:g} x the largest "
                          f"|golden output| {peak:.4g}) = {bound:.4g}: it would pass almost any output")


def _parse_manifest(path: Path, mpath: Path) -> Manifest:
    raw = _read_json(path, mpath, MANIFEST, MAX_MANIFEST_BYTES)
    if not isinstance(raw, dict):
        raise _err(path, f"{MANIFEST} is a JSON {type(raw).__name__}, not an object",
                   hint="pass the directory that `edgehft compile --out` wrote")
    if raw.get("format") != FORMAT:
        raise BundleError(f"{mpath} is not an edgehft manifest (format={_short(raw.get('format'))})",
                          hint="pass the directory that `edgehft compile --out` wrote")
    fv = raw.get("format_version", 1)
    if isinstance(fv, bool) or not isinstance(fv, int) or fv < 1:
        raise _err(path, f"{MANIFEST} has format_version {_short(fv)}, not an integer from 1 to {FORMAT_VERSION}")
    if fv > FORMAT_VERSION:
        raise BundleError(f"{mpath} has format_version {fv}; this edgehft reads up to "
                          f"{FORMAT_VERSION}", hint="upgrade edgehft on this machine")
    try:
        return Manifest.model_validate(raw)
    except ValidationError as exc:
        errs = exc.errors()
        problems = [f"{'.'.join(str(p) for p in e['loc']) or 'manifest'}: {e['msg']}" for e in errs]
        raise _err(path, f"{MANIFEST} is malformed: " + _joined(problems)) from None


def load_bundle(path: str | Path, verify: bool = True) -> Bundle:
    """Open the bundle directory at ``path``: the manifest is read and checked (:func:`check_manifest`);
    with ``verify`` every file too (:meth:`Bundle.verify`). Golden arrays are checked when
    :meth:`Bundle.golden` reads them.

    Raises:
        BundleError: not a directory, no manifest or one that is a symlink, too large, not a UTF-8 JSON
            object, malformed, of an unsupported format version, or refused by :func:`check_manifest`; with
            ``verify``, a file that does not match the manifest or is refused.
    """
    path = Path(path)
    mpath = path / MANIFEST
    if not os.path.lexists(mpath):
        raise BundleError(f"{path} is not an edgehft bundle (no {MANIFEST})",
                          hint="pass the directory that `edgehft compile --out` wrote")
    manifest = _parse_manifest(path, mpath)
    check_manifest(manifest, path)
    bundle = Bundle(path, manifest)
    if verify:
        bundle.verify()
    return bundle


def manifest_json(manifest: Manifest) -> str:
    """``manifest.json``'s text: the manifest as JSON, without ``plans`` when it has none (a bundle of one
    plan reads as it did before plans existed) and without ``golden.sets`` when there are none."""
    exclude: dict = {} if manifest.plans else {"plans": True}
    if manifest.golden is not None and not manifest.golden.sets:
        exclude["golden"] = {"sets": True}
    return manifest.model_dump_json(indent=1, exclude=exclude or None) + "\n"


def plan_files(name: str, manifest: Manifest, files: dict[str, bytes | Path]) -> dict[str, bytes | Path]:
    """The files of plan ``name`` as a sub-bundle of the bundle being written: ``files`` (relative to the
    sub-bundle) under ``plans/<name>/``, and its ``manifest.json`` with their SHA-256 (``manifest.files`` is
    filled in here); pass the result to :func:`write_bundle` with the top level's files.

    Raises:
        BundleError: the sub-bundle's manifest would be refused (:func:`check_manifest`), or it names plans
            itself (plans do not nest).
    """
    if manifest.plans or not PLAN_NAME.fullmatch(name):
        raise BundleError(f"plan {name!r}: a plan's sub-bundle is named by a plan name and carries no plans itself")
    manifest.files = {rel: (hashlib.sha256(c).hexdigest() if isinstance(c, (bytes, bytearray)) else sha256_file(c))
                      for rel, c in sorted(files.items())}
    check_manifest(manifest, f"{PLANS_DIR}/{name}")
    base = f"{PLANS_DIR}/{name}"
    return {**{f"{base}/{rel}": c for rel, c in files.items()}, f"{base}/{MANIFEST}": manifest_json(manifest).encode()}


def write_bundle(out: str | Path, manifest: Manifest, files: dict[str, bytes | Path],
                 report: dict | None = None) -> Bundle:
    """Write a bundle atomically: build it in a temporary sibling, then rename it into ``out``.

    Args:
        out: target directory; an existing bundle there is replaced only once the new one is complete.
        manifest: its ``files`` map is filled in here.
        files: relative path -> bytes, or a path to copy.
        report: written as ``report.json`` (hashed like the other files).
    Raises:
        BundleError: ``out`` exists and is not a bundle (nothing there is touched), or the manifest would be
            refused by :func:`load_bundle` (:func:`check_manifest`; nothing is written).
    """
    out = Path(out).resolve()
    if out.exists() and not (out / MANIFEST).exists() and any(out.iterdir()):
        raise BundleError(f"{out} exists and is not an edgehft bundle; refusing to replace it",
                          hint="choose an empty or new --out directory")
    if report is not None:
        files = {**files, REPORT: json.dumps(report, indent=1).encode()}
    manifest.files = {rel: "0" * 64 for rel in sorted(files)}        # the paths, checked before writing
    check_manifest(manifest, out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    try:
        for rel, content in files.items():
            dst = tmp / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, (bytes, bytearray)):
                dst.write_bytes(content)
            else:
                shutil.copyfile(content, dst)
        manifest.files = {rel: sha256_file(tmp / rel) for rel in sorted(files)}
        (tmp / MANIFEST).write_text(manifest_json(manifest))
        os.chmod(tmp, 0o755)
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.rename(out, old)
            os.rename(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Bundle(out, manifest)
