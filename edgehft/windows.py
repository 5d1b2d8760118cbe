"""Model-input windows from files: ``.npy`` / ``.npz`` arrays, or raw feed files through the model's
feature pipeline (a Python callable named ``path/to/file.py:function`` or ``package.module:function``).

A feature pipeline is code. On the compile host it is the user's own (``--features``, the model's sidecar);
from a bundle it is loaded only through :func:`edgehft.bundle_checks.bundle_pipeline`, on the user's explicit
request, from the bytes whose SHA-256 the manifest lists (:attr:`PipelineRef.sha256`).

A pipeline is called once with the list of raw feed paths (one continuous stream, in order) and returns
either an array of windows or a dict with ``x`` (windows), optional ``t_ns`` (int64 receive time of the
tick that completed each window, ns) and ``y`` (labels). ``.npz`` files use the same keys.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
import types
import zipfile
from edgehft.compat import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from edgehft.errors import BundleError, InputError

SIDECAR_SUFFIX = ".edgehft.toml"


@dataclass
class Windows:
    """``x`` (N, *input_shape) float32; ``t_ns`` int64 (N,) or None; ``y`` (N,) or None; ``source`` paths."""

    x: np.ndarray
    t_ns: np.ndarray | None
    y: np.ndarray | None
    source: list[str]

    def __len__(self) -> int:
        return len(self.x)


@dataclass
class PipelineRef:
    """A feature pipeline: ``file`` (a .py path) or ``module``, and the callable's name. With ``sha256``
    (a pipeline from a bundle) only the file's bytes with that digest are run: read once, hashed, then
    executed from memory, without adding any directory to ``sys.path``."""

    spec: str
    file: Path | None
    module: str | None
    callable: str
    sha256: str | None = None

    def _module(self):
        if self.sha256 is not None:
            src = self.file.read_bytes()
            if hashlib.sha256(src).hexdigest() != self.sha256:
                raise BundleError(f"feature pipeline {self.file} does not match the manifest's SHA-256",
                                  hint="the bundle was modified after compile; compile or copy it again")
            name = f"edgehft_bundle_pipeline_{self.sha256[:16]}"
            mod = types.ModuleType(name)
            mod.__file__ = str(self.file)
            sys.modules[name] = mod              # dataclasses and pickling look their module up here
            exec(compile(src, str(self.file), "exec"), mod.__dict__)
            return mod
        if self.file is not None:
            name = f"edgehft_pipeline_{abs(hash(str(self.file)))}"
            spec = importlib.util.spec_from_file_location(name, self.file)
            mod = importlib.util.module_from_spec(spec)
            sys.path.insert(0, str(self.file.parent))
            try:
                spec.loader.exec_module(mod)
            finally:
                sys.path.remove(str(self.file.parent))
            return mod
        return importlib.import_module(self.module)

    def load(self) -> Callable:
        """Import the callable.

        Raises:
            InputError: the file, module or name does not exist, or importing it fails.
            BundleError: a bundle's pipeline file no longer has the manifest's SHA-256.
        """
        try:
            mod = self._module()
        except BundleError:
            raise
        except (Exception, SystemExit) as exc:
            raise InputError(f"cannot import feature pipeline {self.spec}: {type(exc).__name__}: {exc}") from None
        fn = getattr(mod, self.callable, None)
        if not callable(fn):
            raise InputError(f"feature pipeline {self.spec}: no callable named {self.callable!r}")
        return fn

    def source_file(self) -> Path | None:
        """The single ``.py`` file that holds the pipeline (``file``, or a module's own source file), or
        None when a module is not one plain source file (a package's ``__init__`` counts as not)."""
        if self.file is not None:
            return self.file
        try:
            spec = importlib.util.find_spec(self.module)
        except (ImportError, ValueError):
            return None
        origin = getattr(spec, "origin", None) if spec is not None else None
        if not origin or not origin.endswith(".py") or spec.submodule_search_locations is not None:
            return None
        return Path(origin)


def parse_pipeline(spec: str, base: Path | None = None) -> PipelineRef:
    """``file.py:fn`` (relative to ``base``) or ``package.module:fn``. Raises InputError when malformed."""
    target, sep, fn = spec.rpartition(":")
    if not sep or not target or not fn:
        raise InputError(f"feature pipeline {spec!r} is not 'file.py:function' or 'module:function'")
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_absolute() and base is not None:
            path = base / path
        if not path.is_file():
            raise InputError(f"feature pipeline file {path} does not exist")
        return PipelineRef(spec, path.resolve(), None, fn)
    return PipelineRef(spec, None, target, fn)


def sidecar_pipeline(model: Path) -> PipelineRef | None:
    """The pipeline a model names in its sidecar ``<model>.edgehft.toml`` (``[features] pipeline = …``)."""
    stem = model.name[: -len(model.suffix)] if model.suffix and model.is_file() else model.name
    side = model.parent / (stem + SIDECAR_SUFFIX)
    if not side.is_file():
        return None
    try:
        spec = tomllib.loads(side.read_text()).get("features", {}).get("pipeline")
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{side} is not valid TOML: {exc}") from exc
    return parse_pipeline(spec, side.parent) if spec else None


F32_MAX = float(np.finfo(np.float32).max)


def _memory_bytes() -> int:
    """Physical memory of this machine in bytes (a bound for any array read from a file)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 40


def _check_npy_header(fp, what: str, size: int) -> None:
    """Read the ``.npy`` header at ``fp`` (a file of ``size`` bytes) and refuse what ``np.load`` must not
    see: object (pickled) dtypes, and a shape whose data is larger than the bytes the file holds or than
    this machine's memory (a forged header would make numpy allocate it).

    Raises:
        InputError: naming the array, the shape and dtype the header claims, and the bytes there are.
    """
    fmt = np.lib.format
    version = fmt.read_magic(fp)
    read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
    shape, _, dtype = read(fp)
    if dtype.hasobject:
        raise InputError(f"{what} holds Python objects ({dtype}), which numpy can only unpickle",
                         hint="save plain numeric arrays (np.save / np.savez with float32 or int arrays)")
    need = dtype.itemsize
    for d in shape:
        need *= int(d)
    there = size - fp.tell()
    if need > there or need > _memory_bytes():
        raise InputError(f"{what}: its header claims {dtype} {tuple(shape)} ({need:,} bytes), the file holds "
                         f"{there:,} bytes of data and this machine has {_memory_bytes():,} bytes of memory",
                         hint="the file is truncated or not what it says; write it again with np.save/np.savez")


def _check_array_file(path: Path) -> None:
    """Check the header of every array in a ``.npy``/``.npz`` file before numpy reads any data."""
    if path.suffix == ".npy":
        with open(path, "rb") as fh:
            _check_npy_header(fh, str(path), os.fstat(fh.fileno()).st_size)
        return
    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            with zf.open(info) as fh:
                _check_npy_header(fh, f"{path}:{info.filename}", info.file_size)


def _from_array_file(path: Path) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    try:
        _check_array_file(path)
        if path.suffix == ".npy":
            return np.load(path, allow_pickle=False), None, None
        with np.load(path, allow_pickle=False) as z:
            key = "x" if "x" in z.files else (z.files[0] if len(z.files) == 1 else None)
            if key is None:
                raise InputError(f"{path}: an .npz of windows needs an array named 'x' (has {z.files})")
            return z[key], (z["t_ns"] if "t_ns" in z.files else None), (z["y"] if "y" in z.files else None)
    except InputError:
        raise
    except Exception as exc:   # BadZipFile, MemoryError, zlib.error, EOFError, ValueError, OSError, ...
        raise InputError(f"{path} is not a readable numpy file ({type(exc).__name__}: {exc})",
                         hint="write windows with np.save (.npy) or np.savez (.npz with x, t_ns, y)") from None


def _check_windows(what, x) -> np.ndarray:
    """``x`` as an array of windows (N, ...): numeric, non-empty, finite, and within float32's range.

    Raises:
        InputError: naming the first bad window.
    """
    x = np.asarray(x)
    if x.ndim < 2 or x.dtype.kind not in "fiu" or len(x) == 0:
        raise InputError(f"{what}: expected a non-empty numeric array of windows (N, ...), got {x.dtype} {x.shape}")
    if x.dtype.kind == "f":
        flat = x.reshape(len(x), -1)
        bad = ~np.isfinite(flat.sum(axis=1, dtype=np.float64))   # NaN/inf propagate through a window's sum
        if x.dtype.itemsize > 4 and not bad.any():
            bad = np.abs(flat).max(axis=1) > F32_MAX
        if bad.any():
            i = int(np.argmax(bad))
            w = x[i]
            first = np.argwhere(~np.isfinite(w) | (np.abs(np.nan_to_num(w)) > F32_MAX))
            at = tuple(int(v) for v in (i, *first[0])) if len(first) else (i,)
            raise InputError(f"{what}: window {i} (of {len(x)}) holds NaN, infinity or values beyond float32's "
                             f"range (±{F32_MAX:.3g}), first at {at}, which the model's float32 input cannot take",
                             hint="drop or repair those windows before replaying them")
    return x


def _check_times(what, t, n: int) -> np.ndarray:
    """``t`` as int64 tick times (ns) for ``n`` windows: 1-D, one per window, finite, never decreasing
    (equal times are allowed: two updates can arrive in the same nanosecond).

    Raises:
        InputError: naming what is wrong and where.
    """
    t = np.asarray(t)
    if t.ndim != 1 or len(t) != n or t.dtype.kind not in "fiu":
        raise InputError(f"{what}: t_ns must be one tick time per window, shape ({n},) of integers (ns); got "
                         f"{t.dtype} {t.shape}", hint="t_ns[i] is the receive time of the tick that completed window i")
    if t.dtype.kind == "u" and len(t) and int(t.max()) > np.iinfo(np.int64).max:
        raise InputError(f"{what}: t_ns values exceed int64 nanoseconds", hint="tick times are integer ns")
    if t.dtype.kind == "f":
        if not np.isfinite(t).all():
            raise InputError(f"{what}: t_ns holds NaN or infinity at index {int(np.argmin(np.isfinite(t)))}",
                             hint="tick times are integer nanoseconds")
        if np.abs(t).max() >= 2.0 ** 63:
            raise InputError(f"{what}: t_ns values exceed int64 nanoseconds", hint="tick times are integer ns")
    t = t.astype(np.int64)
    back = np.flatnonzero(t[1:] < t[:-1])          # compared, not subtracted: a difference can overflow int64
    if len(back):
        i = int(back[0])
        raise InputError(f"{what}: tick times go backwards at window {i + 1} ({int(t[i + 1])} ns after {int(t[i])})",
                         hint="sort the windows by receive time, or pass the files in the order they were recorded")
    return t


def load_windows(paths: list[str | Path], pipeline: PipelineRef | None = None) -> Windows:
    """Windows from ``.npy``/``.npz`` files and/or raw feeds (through ``pipeline``).

    Raises:
        InputError: missing or unreadable file (truncated, forged header, pickled objects), raw feed
            without a pipeline, a pipeline that fails or returns no windows, windows that are not a
            numeric array with at least 2 dimensions or hold NaN/inf/values beyond float32, tick times
            that are not one finite integer per window or go backwards.
    """
    if not paths:
        raise InputError("no tick files given")
    paths = [Path(p) for p in paths]
    for p in paths:
        if not p.exists():
            raise InputError(f"no such tick file: {p}")
    arrays = [p for p in paths if p.suffix in (".npy", ".npz")]
    feeds = [p for p in paths if p.suffix not in (".npy", ".npz")]
    xs, ts, ys = [], [], []
    for p in arrays:
        x, t, y = _from_array_file(p)
        xs.append(x), ts.append(t), ys.append(y)
    if feeds:
        if pipeline is None:
            raise InputError(f"{feeds[0]} is a raw feed file and the model names no feature pipeline",
                             hint="pass --features file.py:function, or add [features] pipeline = "
                                  f"'file.py:function' to the model's sidecar <model>{SIDECAR_SUFFIX}")
        fn = pipeline.load()
        try:
            res = fn([str(p) for p in feeds])
        except (Exception, SystemExit) as exc:
            raise InputError(f"feature pipeline {pipeline.spec} failed on {', '.join(map(str, feeds))}: "
                             f"{type(exc).__name__}: {exc}") from exc
        if isinstance(res, dict):
            if "x" not in res:
                raise InputError(f"feature pipeline {pipeline.spec} returned a dict without 'x'")
            xs.append(res["x"]), ts.append(res.get("t_ns")), ys.append(res.get("y"))
        else:
            xs.append(res), ts.append(None), ys.append(None)
    names = [str(p) for p in arrays] + ([f"feature pipeline {pipeline.spec}"] if feeds else [])
    xs = [_check_windows(what, x) for what, x in zip(names, xs)]
    ts = [None if t is None else _check_times(what, t, len(x)) for what, t, x in zip(names, ts, xs)]
    shapes = {x.shape[1:] for x in xs}
    if len(shapes) > 1:
        raise InputError(f"tick files give windows of different shapes: {sorted(shapes)}")
    x = np.concatenate(xs)
    t = _check_times("the tick files, read as one stream", np.concatenate(ts), len(x)) \
        if all(v is not None for v in ts) else None
    y = np.concatenate(ys) if all(v is not None for v in ys) else None
    return Windows(x, t, y, [str(p) for p in paths])
