"""The bundle: a directory with ``manifest.json``, the model file(s), golden vectors and ``report.json``.

Ground floor: imports only the error types. Writing is atomic (a temporary sibling directory renamed
into place), so an interrupted compile never leaves a half bundle where a good one was. Loading checks
every file against the SHA-256 recorded in the manifest.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, Field, ValidationError

from edgehft.errors import BundleError

FORMAT = "edgehft-bundle"
FORMAT_VERSION = 2
# Format 2: the cpu board's native-bf16 plan (native.json steps conv2d / maxpool / concat / reshape). A bundle
# is written with the lowest format that describes it, so boxes with an older edgehft still take the rest.
FORMAT_VERSION_FOR_PLAN = {"native-bf16": 2}
MANIFEST = "manifest.json"
REPORT = "report.json"


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
        return self.scale is not None and self.dtype in ("int8", "uint8", "int16")


class SourceModel(BaseModel):
    file: str
    sha256: str
    flavour: str                      # keras3 | tf-keras | saved-model
    lowering: str                     # how the graph reached the TFLite converter


class Quantization(BaseModel):
    mode: Literal["int8", "dynamic", "fp16", "float", "native", "native-bf16"]
    calibration_sha256: str | None = None
    calibration_windows: int = 0
    calibration_source: list[str] = Field(default_factory=list)
    drift_windows: int = 0


class Golden(BaseModel):
    """Golden vectors: ``inputs/<name>`` and ``outputs/<name>`` arrays in ``file`` (npz), raw dtypes.

    ``reference_path`` names the interpreter path that produced the outputs; ``compare`` is ``exact``
    for integer outputs and ``allclose`` (with ``atol``) for float ones.
    """

    file: str = "golden.npz"
    count: int
    reference_path: str
    compare: Literal["exact", "allclose"]
    atol: float = 0.0


class Features(BaseModel):
    """The model's feature pipeline, copied into the bundle: ``file`` relative to the bundle."""

    file: str
    callable: str


class Manifest(BaseModel):
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


class Bundle:
    """An opened bundle directory (``manifest`` parsed; files verified unless ``verify=False``)."""

    def __init__(self, path: Path, manifest: Manifest):
        self.path = path
        self.manifest = manifest

    def file(self, rel: str) -> Path:
        return self.path / rel

    @property
    def model_path(self) -> Path:
        return self.path / self.manifest.model_file

    def report(self) -> dict:
        p = self.path / REPORT
        return json.loads(p.read_text()) if p.exists() else {}

    def golden(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """``(inputs, outputs)`` golden arrays by tensor name. Raises BundleError if there are none."""
        g = self.manifest.golden
        if g is None:
            raise BundleError(f"bundle {self.path} has no golden vectors", hint="compile it again")
        with np.load(self.path / g.file) as z:
            ins = {k.split("/", 1)[1]: z[k] for k in z.files if k.startswith("inputs/")}
            outs = {k.split("/", 1)[1]: z[k] for k in z.files if k.startswith("outputs/")}
        return ins, outs

    def verify(self) -> None:
        """Check every file listed in the manifest exists and has its recorded SHA-256.

        Raises:
            BundleError: naming each missing or changed file.
        """
        problems = []
        for rel, digest in sorted(self.manifest.files.items()):
            p = self.path / rel
            if not p.is_file():
                problems.append(f"missing {rel}")
            elif sha256_file(p) != digest:
                problems.append(f"{rel} changed (sha256 {sha256_file(p)[:12]}…, manifest says {digest[:12]}…)")
        if problems:
            raise BundleError(f"bundle {self.path} does not match its manifest: " + "; ".join(problems),
                              hint="the bundle was modified or truncated after compile; compile or copy it again")


def load_bundle(path: str | Path, verify: bool = True) -> Bundle:
    """Open the bundle directory at ``path``.

    Raises:
        BundleError: not a directory, no or malformed manifest, unsupported format version, or
            (with ``verify``) a file that does not match the manifest.
    """
    path = Path(path)
    mpath = path / MANIFEST
    if not mpath.is_file():
        raise BundleError(f"{path} is not an edgehft bundle (no {MANIFEST})",
                          hint="pass the directory that `edgehft compile --out` wrote")
    try:
        raw = json.loads(mpath.read_text())
    except json.JSONDecodeError as exc:
        raise BundleError(f"{mpath} is not valid JSON: {exc}") from exc
    if raw.get("format") != FORMAT:
        raise BundleError(f"{mpath} is not an edgehft manifest (format={raw.get('format')!r})")
    if raw.get("format_version", 0) > FORMAT_VERSION:
        raise BundleError(f"{mpath} has format_version {raw.get('format_version')}; this edgehft reads up to "
                          f"{FORMAT_VERSION}", hint="upgrade edgehft on this machine")
    try:
        manifest = Manifest(**raw)
    except ValidationError as exc:
        raise BundleError(f"{mpath} is malformed: {exc}") from exc
    bundle = Bundle(path, manifest)
    if verify:
        bundle.verify()
    return bundle


def write_bundle(out: str | Path, manifest: Manifest, files: dict[str, bytes | Path],
                 report: dict | None = None) -> Bundle:
    """Write a bundle atomically: build it in a temporary sibling, then rename it into ``out``.

    Args:
        out: target directory; an existing bundle there is replaced only once the new one is complete.
        manifest: its ``files`` map is filled in here.
        files: relative path -> bytes, or a path to copy.
        report: written as ``report.json`` (hashed like the other files).
    Raises:
        BundleError: ``out`` exists and is not a bundle (nothing there is touched).
    """
    out = Path(out).resolve()
    if out.exists() and not (out / MANIFEST).exists() and any(out.iterdir()):
        raise BundleError(f"{out} exists and is not an edgehft bundle; refusing to replace it",
                          hint="choose an empty or new --out directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    try:
        if report is not None:
            files = {**files, REPORT: json.dumps(report, indent=1).encode()}
        for rel, content in files.items():
            dst = tmp / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, (bytes, bytearray)):
                dst.write_bytes(content)
            else:
                shutil.copyfile(content, dst)
        manifest.files = {rel: sha256_file(tmp / rel) for rel in sorted(files)}
        (tmp / MANIFEST).write_text(manifest.model_dump_json(indent=1) + "\n")
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
