"""The ``jetson`` backend: the bundle's TensorRT engine (built on this box by ``edgehft build-engine`` and
cached by TensorRT version, L4T, module, DLA core, precision and model hash), named I/O tensors bound to
preallocated pinned host and device buffers, ``execute_async_v3`` on a dedicated CUDA stream, captured
into a CUDA graph when the engine allows it. Same ``open/predict/close`` API as every backend.

Before anything touches TensorRT a child process asks CUDA for a device (TensorRT objects crash the
interpreter without a GPU); with no GPU this refuses with :class:`BoardUnavailableError`. Not run on
NVIDIA hardware in CI: see ``benchmarks/jetson_check.sh``.
"""
from __future__ import annotations

import ctypes

import numpy as np

from edgehft.errors import BoardUnavailableError
from edgehft.runtime.base import InputSlot, OutputSlot, Runner as _Runner
from edgehft.toolchains import tensorrt as trt_tools


def _cudart():
    try:
        from cuda.bindings import runtime as rt
    except ImportError:
        try:
            from cuda import cudart as rt
        except ImportError as exc:
            raise BoardUnavailableError(f"cuda-python is not installed ({exc})", hint=trt_tools.INSTALL_HINT) from None
    return rt


def _check(result, what: str):
    err, *rest = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise BoardUnavailableError(f"CUDA {what} failed: error {int(err)}")
    return rest[0] if len(rest) == 1 else rest


class Runner(_Runner):
    """Args: ``dla_core`` (None: GPU engine), ``cuda_graph`` (capture the enqueue once, replay it)."""

    def __init__(self, bundle, board, *, threads: int = 1, affinity=None, dla_core: int | None = None,
                 cuda_graph: bool = True, emulate: bool = False, device: str | None = None):
        if emulate:
            raise BoardUnavailableError("a Jetson bundle has no emulation: its ONNX runs under onnxruntime on a host "
                                        "(the golden vectors were made that way)",
                                        hint="run it on the board, or compile for --board cpu here")
        super().__init__(bundle, board, threads=threads, affinity=affinity)
        trt = trt_tools.import_tensorrt()                  # probes for a GPU in a child process first
        rt = self.rt = _cudart()
        m = bundle.manifest
        identity = trt_tools.board_identity()
        key = trt_tools.cache_key(trt.__version__, identity, dla_core, m.quantization.mode, m.files[m.model_file])
        path, self.record = trt_tools.load_engine_record(key, trt.__version__, identity)
        self.trt_logger = trt.Logger(trt.Logger.WARNING)
        self.engine = trt.Runtime(self.trt_logger).deserialize_cuda_engine(path.read_bytes())
        if self.engine is None:
            raise BoardUnavailableError(f"TensorRT {trt.__version__} could not load {path.name}",
                                        hint="edgehft build-engine BUNDLE again on this box")
        self.context = self.engine.create_execution_context()
        self.stream = _check(rt.cudaStreamCreate(), "cudaStreamCreate")
        self._host, self._dev, self._bytes = {}, {}, {}
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        for name in names:
            shape = tuple(self.engine.get_tensor_shape(name))
            dtype = np.dtype(trt.nptype(self.engine.get_tensor_dtype(name)))
            n = int(np.prod(shape)) * dtype.itemsize
            hptr = _check(rt.cudaMallocHost(n), "cudaMallocHost")
            dptr = _check(rt.cudaMalloc(n), "cudaMalloc")
            buf = (ctypes.c_byte * n).from_address(int(hptr))
            self._host[name] = np.frombuffer(buf, dtype=dtype).reshape(shape)
            self._dev[name], self._bytes[name] = dptr, n
            self.context.set_tensor_address(name, int(dptr))
        io_in = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        io_out = [n for n in names if n not in io_in]
        self._in, self._out = io_in, io_out
        self.inputs = [InputSlot(s, self._host[n]) for s, n in zip(m.inputs, io_in)]
        self.outputs = [OutputSlot(s, self._host[n]) for s, n in zip(m.outputs, io_out)]
        self._graph = self._capture() if cuda_graph else None

    def _enqueue(self) -> None:
        rt = self.rt
        h2d, d2h = rt.cudaMemcpyKind.cudaMemcpyHostToDevice, rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        for n in self._in:
            _check(rt.cudaMemcpyAsync(self._dev[n], self._host[n].ctypes.data, self._bytes[n], h2d, self.stream),
                   "cudaMemcpyAsync")
        if not self.context.execute_async_v3(int(self.stream)):
            raise BoardUnavailableError("TensorRT execute_async_v3 failed")
        for n in self._out:
            _check(rt.cudaMemcpyAsync(self._host[n].ctypes.data, self._dev[n], self._bytes[n], d2h, self.stream),
                   "cudaMemcpyAsync")

    def _capture(self):
        rt = self.rt
        try:
            self._enqueue()                                       # one plain run first (TensorRT's advice)
            _check(rt.cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")
            _check(rt.cudaStreamBeginCapture(self.stream, rt.cudaStreamCaptureMode.cudaStreamCaptureModeGlobal),
                   "cudaStreamBeginCapture")
            self._enqueue()
            graph = _check(rt.cudaStreamEndCapture(self.stream), "cudaStreamEndCapture")
            return _check(rt.cudaGraphInstantiate(graph, 0), "cudaGraphInstantiate")
        except BoardUnavailableError:
            return None                                           # some engines cannot be captured

    def _invoke(self) -> None:
        rt = self.rt
        if self._graph is not None:
            _check(rt.cudaGraphLaunch(self._graph, self.stream), "cudaGraphLaunch")
        else:
            self._enqueue()
        _check(rt.cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")

    def describe(self) -> dict:
        d = super().describe()
        d.update(backend="jetson", tensorrt=self.record.get("tensorrt"), identity=self.record.get("identity"),
                 dla_core=self.record.get("dla_core"), cuda_graph=self._graph is not None)
        return d

    def close(self) -> None:
        rt = getattr(self, "rt", None)
        if rt is not None:
            for p in getattr(self, "_dev", {}).values():
                rt.cudaFree(p)
            for a in getattr(self, "_host", {}).values():
                rt.cudaFreeHost(a.ctypes.data)
            self._dev, self._host = {}, {}
        super().close()
