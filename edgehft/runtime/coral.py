"""The ``coral`` backend: the bundle's Edge TPU compiled model through libedgetpu's TFLite delegate.

A coral bundle holds ``model.tflite`` (the full-int8 IR, the golden reference) and, when the vendor
``edgetpu_compiler`` was available at compile time, the compiled model named by
``manifest.artifacts["edgetpu_model"]``. Opening it on a device checks, in order, each with its own error
and fix: (a) the compiled model is in the bundle, (b) libedgetpu loads, (c) its runtime version is at
least the compiled model's ``min_runtime_version`` (read from the model's ``DWN1`` package, before the
delegate is touched), (d) the requested Edge TPU is attached, (e) the delegate and interpreter load.

``emulate=True`` needs none of that: ``model.tflite`` runs on the host CPU exactly as the cpu backend
runs it (LiteRT's int8 kernels for every op, the Edge TPU segment's included). Outputs then equal the
golden vectors bit for bit; Edge TPU timing is not represented.

The hot path is the cpu backend's (zero-copy views into the interpreter, one ``Invoke``).
"""
from __future__ import annotations

import re
from pathlib import Path

from edgehft.errors import BoardUnavailableError, BundleError, EdgeHFTError, InputError
from edgehft.ir.edgetpu_package import min_runtime_version as _package_min_runtime, read_packages
from edgehft.ir.tflite_model import TFLiteModel
from edgehft.runtime import coral_device, cpu, litert
from edgehft.runtime.coral_device import describe_devices, library_name

ARTIFACT = "edgetpu_model"
EMULATION_NOTE = ("the int8 model runs on this host's CPU (LiteRT int8 kernels for the CPU and the Edge TPU "
                  "segments alike): outputs are the int8 graph's; Edge TPU timing is not represented")
COMPILER_HINT = ("compile on an x86-64 Debian/Ubuntu host with the Edge TPU compiler installed (Coral's apt "
                 "repository `deb https://packages.cloud.google.com/apt coral-edgetpu-stable main`, package "
                 "`edgetpu-compiler`), or pass --emulate to run the int8 model on the CPU")


def _cpu_model_hint(model_path) -> str:
    name = Path(str(model_path)).name if model_path else ""
    if name.endswith("_edgetpu.tflite"):
        return name[: -len("_edgetpu.tflite")] + ".tflite"
    return "(the int8 model the converter wrote, not the edgetpu_compiler output)"


def runtime_too_old_error(runtime: int | None, required: int | None, library: str = "libedgetpu") \
        -> BoardUnavailableError:
    """The error for a libedgetpu older than the compiled model needs (both versions named)."""
    return BoardUnavailableError(
        f"the Edge TPU runtime {library} is version {runtime if runtime is not None else '?'}, but the "
        f"compiled model needs runtime version >= {required if required is not None else '?'}",
        hint="upgrade libedgetpu1-std (or -max) from Coral's repository (`sudo apt-get update && sudo "
             "apt-get install --only-upgrade libedgetpu1-std`; macOS/Windows: the latest edgetpu_runtime "
             f"from https://coral.ai/software), or compile with `edgetpu_compiler -m {runtime}` for this "
             "runtime (what maps may change), or pass --emulate")


def no_device_error(devices: list[dict] | None, device: str | None, detail: str = "") -> BoardUnavailableError:
    """The error for no Edge TPU attached, or not the one ``device`` asks for (``devices`` as listed by
    :func:`edgehft.runtime.coral_device.list_devices`; None when unknown)."""
    want = f"Edge TPU {device!r}" if device else "an Edge TPU"
    seen = describe_devices(devices) if devices is not None else "unknown"
    return BoardUnavailableError(
        f"{want} is not attached; attached: {seen}" + (f" ({detail})" if detail else ""),
        hint="plug in the USB Accelerator (a USB 3 port; a new one re-enumerates as 18d1:9302 after the "
             "first use) or check the PCIe/M.2 module's driver (`ls /dev/apex_*`, package gasket-dkms); "
             "add your user to the plugdev (USB) or apex (PCIe) group; choose an attached one with "
             "--device usb|usb:N|pci|pci:N; or pass --emulate")


def explain_interpreter_error(exc: BaseException, *, model_path=None, runtime: int | None = None,
                              required: int | None = None, devices: list[dict] | None = None,
                              device: str | None = None) -> EdgeHFTError | None:
    """Map a TFLite interpreter / delegate exception to a clear edgehft error, or None if unknown.

    Known messages: ``Encountered unresolved custom op: edgetpu-custom-op`` (a compiled model opened
    without the Edge TPU delegate) -> BundleError; ``Failed to load delegate`` -> no-device
    BoardUnavailableError; ``Package requires runtime version`` -> runtime-too-old BoardUnavailableError.
    The keyword arguments only add detail to the messages.
    """
    text = str(exc)
    if "unresolved custom op" in text and "edgetpu-custom-op" in text:
        name = Path(str(model_path)).name if model_path else "the model"
        return BundleError(
            f"{name} is compiled for the Edge TPU (it holds edgetpu-custom-op) and was opened without the "
            "Edge TPU delegate",
            hint=f"open it with board coral-* (Edge TPU delegate) or use the CPU model {_cpu_model_hint(model_path)}")
    if "Package requires runtime version" in text:
        found = [int(v) for v in re.findall(r"version \((\d+)\)", text)]   # (needed), (this runtime)
        if required is None and found:
            required = found[0]
        if runtime is None and len(found) > 1:
            runtime = found[1]
        return runtime_too_old_error(runtime, required)
    if "Failed to load delegate" in text:
        said = " ".join(text.split("\n", 1)[1:]).strip()
        return no_device_error(devices, device, f"the delegate said: {said}" if said else "")
    return None


class Runner(cpu.Runner):
    """The bundle on an Edge TPU (or, with ``emulate=True``, its int8 model on the CPU).

    Args:
        bundle, board, threads, affinity: as the cpu backend (``threads`` drives the CPU segments).
        device: ``usb``, ``usb:N``, ``pci``, ``pci:N``, or ``""`` (first attached); None takes the board's
            ``[runtime] device``.
        emulate: run ``model.tflite`` on the CPU interpreter; no library or device needed.
        op_resolver: LiteRT kernels for the CPU ops (see :func:`edgehft.runtime.litert.make_interpreter`).
    Raises:
        InputError: an invalid ``device`` selector.
        BundleError: the compiled model is missing from disk, malformed, or disagrees with the manifest.
        BoardUnavailableError: no compiled model in the bundle, libedgetpu missing or too old, no
            (such) Edge TPU, or the delegate failed to load.
    """

    def __init__(self, bundle, board, *, threads: int = 1, affinity=None, device: str | None = None,
                 emulate: bool = False, op_resolver: str = "auto"):
        runtime_cfg = getattr(board, "runtime", {}) or {}
        self.device = str(runtime_cfg.get("device", "") if device is None else device)
        coral_device.parse_device(self.device)
        self.emulated = bool(emulate)
        self._delegate = None
        if not self.emulated:
            self._preflight(bundle)
        super().__init__(bundle, board, threads=threads, affinity=affinity, op_resolver=op_resolver)
        if not self.emulated:
            self.path = f"{self.path} + libedgetpu runtime {self.runtime_version} on {self.device_name}"

    # -- checks (a)-(d), before any interpreter or delegate exists ---------------------------------
    def _preflight(self, bundle) -> None:
        m = bundle.manifest
        rel = m.artifacts.get(ARTIFACT)
        if not rel:
            raise BoardUnavailableError(
                f"bundle {bundle.path} has no Edge TPU compiled model: edgetpu_compiler was not on PATH "
                "when it was compiled (only the int8 CPU model is in it)", hint=COMPILER_HINT)
        self.compiled_path = bundle.path / rel
        if not self.compiled_path.is_file():
            raise BundleError(f"bundle {bundle.path} names compiled model {rel}, which is missing",
                              hint="copy the whole bundle directory again, or compile it again")
        try:
            self.compiled_ir = TFLiteModel.from_file(self.compiled_path)
            packages = read_packages(self.compiled_ir)
            required = _package_min_runtime(self.compiled_ir)
        except InputError as exc:
            raise BundleError(f"bundle {bundle.path}: compiled model {rel} is unreadable: "
                              f"{exc.args[0] if exc.args else exc}", hint=COMPILER_HINT) from exc
        declared = m.accelerator.get("min_runtime_version")
        if declared is not None and required is not None and int(declared) != required:
            raise BundleError(f"bundle {bundle.path}: manifest says min_runtime_version {declared}, but "
                              f"{rel}'s Edge TPU package says {required}",
                              hint="the manifest and the compiled model disagree; compile the bundle again")
        self.min_runtime_version = required if required is not None else declared
        self.compiler_version = (packages[0][1].compiler_version if packages
                                 else m.accelerator.get("compiler_version"))
        self.segments = len(packages)

        self._lib = coral_device.load_library()                                   # (b)
        self.library = coral_device.library_path(self._lib)
        self.runtime_version = coral_device.runtime_version(self._lib)
        if self.min_runtime_version is not None and self.runtime_version < int(self.min_runtime_version):
            raise runtime_too_old_error(self.runtime_version, int(self.min_runtime_version), self.library)
        self.devices = coral_device.list_devices(self._lib)                      # (d)
        chosen = coral_device.find_device(self.devices, self.device)
        if chosen is None:
            raise no_device_error(self.devices, self.device)
        self.device_name = chosen["name"]
        self.device_path = chosen["path"]

    # -- hooks into the cpu backend ---------------------------------------------------------------
    def _make_interpreter(self):
        if self.emulated:
            return super()._make_interpreter()
        mod, _, _ = litert.load_interpreter_module()
        context = dict(model_path=self.compiled_path, runtime=self.runtime_version,
                       required=self.min_runtime_version, devices=self.devices, device=self.device)
        options = {"device": self.device_name} if self.device else None
        try:
            self._delegate = mod.load_delegate(library_name(), options)
        except OSError as exc:
            raise BoardUnavailableError(f"the Edge TPU delegate could not load {library_name()}: {exc}",
                                        hint=coral_device.INSTALL_HINT) from None
        except (ValueError, RuntimeError, AttributeError) as exc:
            err = explain_interpreter_error(exc, **context) or no_device_error(self.devices, self.device,
                                                                                f"{type(exc).__name__}: {exc}")
            raise err from exc
        kind = {"auto": mod.OpResolverType.AUTO,
                "builtin": mod.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
                "reference": mod.OpResolverType.BUILTIN_REF}.get(self.op_resolver)
        if kind is None:
            raise ValueError(f"op_resolver must be one of {litert.OP_RESOLVERS}, got {self.op_resolver!r}")
        try:
            with litert.quiet_runtime_info():
                interp = mod.Interpreter(model_path=str(self.compiled_path), experimental_delegates=[self._delegate],
                                         num_threads=self.threads, experimental_op_resolver_type=kind)
                interp.allocate_tensors()
        except (ValueError, RuntimeError) as exc:
            err = explain_interpreter_error(exc, **context)
            if isinstance(err, BundleError):
                err = BoardUnavailableError(
                    f"{self.compiled_path.name} was opened without the Edge TPU delegate taking its "
                    "edgetpu-custom-op (the delegate loaded but did not claim it)",
                    hint="reinstall libedgetpu1-std from Coral's repository; check that "
                         f"{library_name()} is libedgetpu and not another delegate")
            raise (err or BoardUnavailableError(
                f"the Edge TPU interpreter failed to open {self.compiled_path.name}: {exc}",
                hint="check `edgehft boards --probe`; reconnect the device; or pass --emulate")) from exc
        return interp

    def _loaded_model_file(self):
        return self.bundle.model_path if self.emulated else self.compiled_path

    def _io_specs(self):
        ins, outs = super()._io_specs()
        if self.emulated:
            return ins, outs
        g = self.compiled_ir.main
        return Runner._remap(ins, g.inputs, g, "input"), Runner._remap(outs, g.outputs, g, "output")

    @staticmethod
    def _remap(specs, indices, g, what):
        """The manifest's specs, pointed at the compiled model's tensors (matched by position)."""
        if len(specs) != len(indices):
            raise BundleError(f"compiled model has {len(indices)} {what}(s), the manifest {len(specs)}",
                              hint="compile the bundle again")
        out = []
        for s, i in zip(specs, indices):
            t = g.tensors[i]
            if list(t.shape) != list(s.shape) or t.dtype != s.dtype:
                raise BundleError(f"compiled model's {what} {t.name!r} is {t.dtype}{list(t.shape)}, the "
                                  f"manifest's {s.name!r} {s.dtype}{s.shape}", hint="compile the bundle again")
            q = {"scale": [float(x) for x in t.quant.scale], "zero_point": [int(z) for z in t.quant.zero_point]} \
                if t.quant is not None and s.scale is not None else {}
            out.append(s.model_copy(update={"index": int(i), **q}))
        return out

    def describe(self) -> dict:
        """Board, threads, affinity and either the emulation note or the device: runtime version,
        device name and path, library path, the compiled model's min_runtime_version."""
        d = super().describe()
        d.update(backend="coral", emulated=self.emulated)
        if self.emulated:
            d.update(note=EMULATION_NOTE, model=str(self.bundle.manifest.model_file))
        else:
            d.update(runtime_version=self.runtime_version, device=self.device_name,
                     device_path=self.device_path, library=self.library,
                     min_runtime_version=self.min_runtime_version, compiler_version=self.compiler_version,
                     model=self.compiled_path.name, edgetpu_segments=self.segments)
        return d

    def close(self) -> None:
        super().close()                      # drops the interpreter first: it must go before its delegate
        self._delegate = None
