"""TensorRT on the board: probe for a GPU without crashing, build an engine from the bundle's ONNX with the
installed TensorRT (10.x API: strongly typed networks for explicit Q/DQ, ``build_serialized_network``),
read the real per-layer placement from the engine inspector, and cache engines by what makes them
non-portable (TensorRT version, L4T release, module, DLA core, precision, model hash).

Never imported at ``import edgehft``: TensorRT objects crash the interpreter on a machine without a GPU,
so :func:`probe_gpu` runs the CUDA device query in a child process first. Nothing here ran on NVIDIA
hardware in this project's CI (no GPU there): the GPU paths are exercised by ``benchmarks/jetson_check.sh``
and by the tests that run only where a GPU and TensorRT are present.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from edgehft.errors import BoardUnavailableError, BundleError, ConverterError

_PROBE = ("import json\n"
          "try:\n"
          "    from cuda.bindings import runtime as rt\n"
          "except ImportError:\n"
          "    from cuda import cudart as rt\n"
          "err, n = rt.cudaGetDeviceCount()\n"
          "print(json.dumps({'error': int(err), 'devices': int(n)}))\n")
INSTALL_HINT = ("on a Jetson, TensorRT and CUDA come with JetPack (python3-libnvinfer); cuda-python gives the "
                "device query: pip install cuda-python")


def probe_gpu(timeout_s: float = 20.0) -> dict:
    """``{"gpus": N, "error": str | None}`` from ``cudaGetDeviceCount`` in a child process (a crash or a
    missing CUDA there cannot take this process down). Never raises."""
    try:
        r = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"gpus": 0, "error": f"GPU probe failed: {exc}"}
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["no output"])[-1]
        return {"gpus": 0, "error": f"GPU probe exited {r.returncode}: {last}"}
    d = json.loads(r.stdout.strip().splitlines()[-1])
    if d["error"] != 0 or d["devices"] < 1:
        return {"gpus": 0, "error": f"cudaGetDeviceCount: error {d['error']}, {d['devices']} device(s)"}
    return {"gpus": d["devices"], "error": None}


def require_gpu() -> int:
    """Raise :class:`BoardUnavailableError` unless an NVIDIA GPU answers; returns the device count."""
    p = probe_gpu()
    if not p["gpus"]:
        raise BoardUnavailableError(f"no NVIDIA GPU here ({p['error']})",
                                    hint="run this on the Jetson (or a machine with an NVIDIA GPU and TensorRT); "
                                         + INSTALL_HINT)
    return p["gpus"]


def import_tensorrt():
    """``tensorrt`` after :func:`require_gpu`. Raises BoardUnavailableError if it is not installed."""
    require_gpu()
    try:
        import tensorrt as trt
    except ImportError as exc:
        raise BoardUnavailableError(f"TensorRT is not installed ({exc})", hint=INSTALL_HINT) from None
    return trt


def board_identity() -> dict:
    """L4T release and module name of this box (empty strings off a Jetson)."""
    rel = Path("/etc/nv_tegra_release")
    model = Path("/proc/device-tree/model")
    return {"l4t": rel.read_text().splitlines()[0].strip() if rel.exists() else "",
            "module": model.read_bytes().rstrip(b"\0").decode(errors="replace") if model.exists() else ""}


def cache_key(trt_version: str, identity: dict, dla_core: int | None, precision: str, model_sha: str) -> str:
    """What an engine depends on, hashed: TensorRT version, L4T, module, DLA core, precision, model."""
    text = json.dumps([trt_version, identity.get("l4t"), identity.get("module"), dla_core, precision, model_sha])
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def cache_dir() -> Path:
    base = os.environ.get("EDGEHFT_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache")),
                                                           "edgehft")
    return Path(base) / "engines"


def build_engine(onnx_path: Path, precision: str, *, dla_core: int | None = None, gpu_fallback: bool = True,
                 workspace_mib: int = 1024) -> tuple[bytes, list[dict], str]:
    """Build a serialized engine with the installed TensorRT. Returns ``(engine bytes, per-layer placement
    from the inspector, TensorRT version)``; the placement is
    :func:`edgehft.ir.tensorrt_inspector.inspector_layers` of the inspector's JSON
    (``name``, ``type``, ``device`` DLA/GPU, ``onnx`` node names from the layer metadata, ``glue``).

    ``precision``: ``fp16`` / ``float`` (``fp16`` sets the FP16 flag on TensorRT < 11; a float16 ONNX is
    built as is on 11+), ``int8`` (explicit Q/DQ: a strongly typed network).
    Raises:
        BoardUnavailableError: no GPU / no TensorRT. ConverterError: the parser or builder refused.
    """
    trt = import_tensorrt()
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    major = int(trt.__version__.split(".")[0])
    flags = 0
    if precision == "int8" or major >= 11:
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(Path(onnx_path).read_bytes()):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise ConverterError(f"TensorRT {trt.__version__}'s ONNX parser refused {Path(onnx_path).name}: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_mib << 20)
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    if precision == "fp16" and major < 11:
        config.set_flag(trt.BuilderFlag.FP16)
    if dla_core is not None:
        config.default_device_type = trt.DeviceType.DLA
        config.DLA_core = int(dla_core)
        if gpu_fallback:
            config.set_flag(trt.BuilderFlag.GPU_FALLBACK)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise ConverterError(f"TensorRT {trt.__version__} could not build an engine for {Path(onnx_path).name}",
                             hint="see the TensorRT log above; try without --dla-core or with more --workspace-mib")
    data = bytes(plan)
    engine = trt.Runtime(logger).deserialize_cuda_engine(data)
    from edgehft.ir.tensorrt_inspector import inspector_layers
    info = engine.create_engine_inspector().get_engine_information(trt.LayerInformationFormat.JSON)
    layers = inspector_layers(info, dla_core)
    return data, layers, trt.__version__


def save_engine(key: str, data: bytes, record: dict) -> Path:
    """Write ``<cache>/<key>.engine`` and ``<key>.json`` (versions, placement); returns the engine path."""
    d = cache_dir()
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{key}.json").write_text(json.dumps(record, indent=1))
    path = d / f"{key}.engine"
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
    return path


def load_engine_record(key: str, trt_version: str, identity: dict) -> tuple[Path, dict]:
    """The cached engine for ``key``, refused when it was built by another TensorRT or on another box."""
    d = cache_dir()
    path, meta = d / f"{key}.engine", d / f"{key}.json"
    if not path.exists() or not meta.exists():
        raise BoardUnavailableError("no engine built for this bundle on this box",
                                    hint="edgehft build-engine BUNDLE (on the Jetson)")
    rec = json.loads(meta.read_text())
    if rec.get("tensorrt") != trt_version or rec.get("identity") != identity:
        raise BundleError(f"engine {path.name} was built by TensorRT {rec.get('tensorrt')} on "
                          f"{rec.get('identity')}; this is TensorRT {trt_version} on {identity}",
                          hint="engines are not portable: run edgehft build-engine BUNDLE again here")
    return path, rec
