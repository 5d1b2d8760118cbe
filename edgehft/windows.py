"""Model-input windows from files: ``.npy`` / ``.npz`` arrays, or raw feed files through the model's
feature pipeline (a Python callable named ``path/to/file.py:function`` or ``package.module:function``).

A pipeline is called once with the list of raw feed paths (one continuous stream, in order) and returns
either an array of windows or a dict with ``x`` (windows), optional ``t_ns`` (int64 receive time of the
tick that completed each window, ns) and ``y`` (labels). ``.npz`` files use the same keys.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from edgehft.errors import InputError

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
    """A feature pipeline: ``file`` (a .py path) or ``module``, and the callable's name."""

    spec: str
    file: Path | None
    module: str | None
    callable: str

    def load(self) -> Callable:
        """Import the callable. Raises InputError if the file, module or name does not exist."""
        try:
            if self.file is not None:
                name = f"edgehft_pipeline_{abs(hash(str(self.file)))}"
                spec = importlib.util.spec_from_file_location(name, self.file)
                mod = importlib.util.module_from_spec(spec)
                sys.path.insert(0, str(self.file.parent))
                try:
                    spec.loader.exec_module(mod)
                finally:
                    sys.path.remove(str(self.file.parent))
            else:
                mod = importlib.import_module(self.module)
        except (OSError, ImportError, SyntaxError) as exc:
            raise InputError(f"cannot import feature pipeline {self.spec}: {exc}") from exc
        fn = getattr(mod, self.callable, None)
        if not callable(fn):
            raise InputError(f"feature pipeline {self.spec}: no callable named {self.callable!r}")
        return fn


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


def _from_array_file(path: Path) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    try:
        if path.suffix == ".npy":
            return np.load(path, allow_pickle=False), None, None
        with np.load(path, allow_pickle=False) as z:
            key = "x" if "x" in z.files else (z.files[0] if len(z.files) == 1 else None)
            if key is None:
                raise InputError(f"{path}: an .npz of windows needs an array named 'x' (has {z.files})")
            return z[key], (z["t_ns"] if "t_ns" in z.files else None), (z["y"] if "y" in z.files else None)
    except (OSError, ValueError) as exc:
        raise InputError(f"{path} is not a readable numpy file: {exc}") from exc


def load_windows(paths: list[str | Path], pipeline: PipelineRef | None = None) -> Windows:
    """Windows from ``.npy``/``.npz`` files and/or raw feeds (through ``pipeline``).

    Raises:
        InputError: missing file, raw feed without a pipeline, a pipeline that fails or returns no
            windows, windows that are not a float array with at least 2 dimensions.
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
        except Exception as exc:
            raise InputError(f"feature pipeline {pipeline.spec} failed on {', '.join(map(str, feeds))}: "
                             f"{type(exc).__name__}: {exc}") from exc
        if isinstance(res, dict):
            if "x" not in res:
                raise InputError(f"feature pipeline {pipeline.spec} returned a dict without 'x'")
            xs.append(res["x"]), ts.append(res.get("t_ns")), ys.append(res.get("y"))
        else:
            xs.append(res), ts.append(None), ys.append(None)
    for p, x in zip(arrays + feeds, xs):
        x = np.asarray(x)
        if x.ndim < 2 or x.dtype.kind not in "fiu" or len(x) == 0:
            raise InputError(f"{p}: expected a non-empty numeric array of windows (N, ...), got "
                             f"{x.dtype} {x.shape}")
    shapes = {np.asarray(x).shape[1:] for x in xs}
    if len(shapes) > 1:
        raise InputError(f"tick files give windows of different shapes: {sorted(shapes)}")
    x = np.concatenate([np.asarray(a) for a in xs])
    t = np.concatenate(ts).astype(np.int64) if all(v is not None for v in ts) else None
    y = np.concatenate(ys) if all(v is not None for v in ys) else None
    return Windows(x, t, y, [str(p) for p in paths])
