"""The ``pynq`` backend: CPU segments on LiteRT, FULLY_CONNECTED / LSTM on the edgehft overlay through
pynq itself (``Overlay`` with the ``.hwh``, ``DefaultIP`` drivers bound by VLNV and version,
``pynq.allocate`` buffers with flush/invalidate, ap_done polled), weights loaded once at open.

The bundle's ``steps.json`` is the chain: CPU segment models and kernel calls, tensors handed over by
name. With ``emulate=True`` the same driver code runs against :mod:`edgehft.emulate` (an emulated board
serving the overlay's registers, device memory kept apart from host memory, the kernels C-simulated
from ``bitstreams/kernels``). pynq pins numpy < 2: this backend runs in the board's venv, never next to
TensorFlow, and imports pynq only when a pynq bundle is opened.
"""
from __future__ import annotations

import json
import tempfile
import time
from edgehft.compat import removeprefix, tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np

from edgehft.errors import BoardUnavailableError, BundleError, InputError
from edgehft.runtime.base import InputSlot, OutputSlot, Runner as _Runner
from edgehft.runtime.litert import (check_model_file, interpreter_path, load_interpreter_module, quiet_runtime_info,
                                    variable_tensors)

POLL_TIMEOUT_S = 5.0
_DRIVERS: dict[str, type] = {}
PYNQ_HINT = ("on a PYNQ board pynq comes with the image (pynq 4.0); elsewhere make the emulated board's venv with "
             "`python -m edgehft.emulate.board_venv VENV` (pynq 4.0.0 pins numpy < 2, so it needs its own venv, "
             "without TensorFlow) and run edgehft from VENV/bin")


def _import_pynq():
    try:
        import pynq
    except ImportError as exc:
        raise BoardUnavailableError(f"pynq is not installed here ({exc})", hint=PYNQ_HINT) from None
    return pynq


def _interface() -> dict:
    from edgehft.emulate.hwh import interface_path
    return tomllib.loads(interface_path().read_text())


def driver_classes(pynq, interface: dict) -> dict[str, type]:
    """One ``DefaultIP`` subclass per kernel, bound to its exact VLNV (name *and* version). Created once
    per process (pynq keeps a global registry)."""
    for kernel, spec in interface.items():
        if kernel in _DRIVERS:
            continue
        offsets = {a["name"]: (a["offset"], a["bits"]) for a in spec["args"]}

        def call(self, **args):
            """Write the argument registers, set ap_start, poll ap_done (interrupts need UIO)."""
            for name, value in args.items():
                off, bits = self.OFFSETS[name]
                self.write(off, int(value) & 0xFFFFFFFF)
                if bits == 64:
                    self.write(off + 4, (int(value) >> 32) & 0xFFFFFFFF)
            self.write(0x00, 0x1)
            deadline = time.monotonic() + POLL_TIMEOUT_S
            while not self.read(0x00) & 0x2:
                if time.monotonic() > deadline:
                    raise BoardUnavailableError(f"{self.KERNEL} did not raise ap_done in {POLL_TIMEOUT_S} s",
                                                hint="reload the overlay; check the bitstream matches the board")

        _DRIVERS[kernel] = type(f"{kernel}_driver", (pynq.DefaultIP,),
                                {"bindto": [spec["vlnv"]], "OFFSETS": offsets, "KERNEL": kernel, "call": call})
    return _DRIVERS


class Runner(_Runner):
    """A pynq bundle on a PYNQ board (or ``emulate=True``: on the emulated board).

    Args:
        overlay: the overlay's ``.bit`` (its ``.hwh`` next to it); default the board's
            ``[runtime] overlay_dir`` / ``<overlay>.bit``.
    Raises:
        BoardUnavailableError: pynq missing, overlay or ``.hwh`` missing, the overlay built for another
            part, a kernel IP whose VLNV/version this edgehft does not drive, a kernel that never finishes.
        BundleError: the bundle has no ``steps.json`` (compiled for another backend).
    """

    def __init__(self, bundle, board, *, threads: int = 1, affinity=None, emulate: bool = False,
                 overlay: str | Path | None = None, op_resolver: str = "auto", device: str | None = None):
        if device:
            raise InputError(f"--device {device}: PYNQ boards have one overlay; --device is for Edge TPU boards")
        super().__init__(bundle, board, threads=threads, affinity=affinity)
        self.emulated = bool(emulate)
        pynq = _import_pynq()
        rel = bundle.manifest.artifacts.get("steps")
        if not rel:
            raise BundleError(f"bundle {bundle.path} has no steps.json: it was not compiled for a PYNQ board")
        self.graph = json.loads((bundle.path / rel).read_text())
        iface = _interface()
        drivers = driver_classes(pynq, iface)
        self._installed, self._tmp = None, None
        bit = self._overlay_path(board, overlay, iface)
        self._check_part(bit.with_suffix(".hwh"), board)
        self.overlay = pynq.Overlay(str(bit))
        self.ips = {}
        for kernel, spec in iface.items():
            ip = getattr(self.overlay, f"{kernel}_0", None)
            if not isinstance(ip, drivers[kernel]):
                found = self.overlay.ip_dict.get(f"{kernel}_0", {}).get("type", "nothing")
                raise BoardUnavailableError(f"overlay {bit.name}: {kernel}_0 is {found}; this edgehft drives "
                                            f"{spec['vlnv']} (name and version must match)",
                                            hint="build the overlay from this edgehft's bitstreams/ (make -C "
                                                 "bitstreams/recipes), or use the edgehft that matches it")
            self.ips[kernel] = ip
        self._open_steps(pynq, op_resolver)
        m = bundle.manifest
        self._staging_in = [np.empty(s.shape, dtype=s.dtype) for s in m.inputs]
        self._staging_out = [np.empty(s.shape, dtype=s.dtype) for s in m.outputs]
        self.inputs = [InputSlot(s, buf) for s, buf in zip(m.inputs, self._staging_in)]
        self.outputs = [OutputSlot(s, buf) for s, buf in zip(m.outputs, self._staging_out)]

    # -- open ----------------------------------------------------------------------------------------
    def _overlay_path(self, board, overlay, iface) -> Path:
        name = board.overlay["name"]
        if self.emulated:
            from edgehft.emulate import EmulatedPynqDevice, install, write_placeholder_bit
            from edgehft.emulate.hwh import write_emulation_hwh
            from edgehft.kernels.fpga.csim import CSimDenseKernel, CSimLstmKernel, KernelLibrary
            self._tmp = tempfile.TemporaryDirectory(prefix="edgehft-pynq-emu-")
            hwh = write_emulation_hwh(Path(board.path), _hwh_interface(), Path(self._tmp.name))
            lib = KernelLibrary()
            device = EmulatedPynqDevice(hwh, {iface["dense_int8"]["vlnv"]: CSimDenseKernel(lib),
                                              iface["lstm_int8"]["vlnv"]: CSimLstmKernel(lib)},
                                        board=board.runtime.get("pynq_board"))
            self.device = device
            self._installed = install(device)
            return write_placeholder_bit(hwh)
        bit = Path(overlay) if overlay else Path(board.runtime.get("overlay_dir", "/home/xilinx/edgehft/overlays")) \
            / f"{name}.bit"
        if not bit.is_file():
            raise BoardUnavailableError(f"no overlay bitstream {bit}",
                                        hint=f"build it (bitstreams/README.md) and copy {name}.bit and .hwh to "
                                             f"{bit.parent} on the board, pass --overlay PATH, or run with --emulate")
        if not bit.with_suffix(".hwh").is_file():
            raise BoardUnavailableError(f"{bit.name} has no {bit.with_suffix('.hwh').name} next to it",
                                        hint="pynq needs the .hwh with the same stem as the .bit")
        self.device = None
        return bit

    @staticmethod
    def _check_part(hwh: Path, board) -> None:
        from edgehft.emulate.hwh import split_part
        info = ET.parse(hwh).getroot().find("SYSTEMINFO")
        want = split_part(board.fpga["part"], board.fpga["family"])[:2]
        got = (info.get("DEVICE", ""), info.get("PACKAGE", "")) if info is not None else ("?", "?")
        if tuple(removeprefix(x.lower(), "xc") for x in got) != tuple(removeprefix(x.lower(), "xc") for x in want):
            raise BoardUnavailableError(f"{hwh.name} was built for part {''.join(got)}, board {board.name} is "
                                        f"{board.fpga['part']}", hint="use the overlay built for this board")

    def _check_steps(self) -> None:
        """Every step of ``steps.json`` is a CPU segment or a kernel call of this overlay whose dims, slot,
        files, lengths, params header and I/O sizes agree with each other and with the overlay's limits,
        before any DMA: a bundle is untrusted, and a kernel reading past a buffer on the board is a bus
        error or a read of someone else's memory.

        Raises:
            BundleError: naming the step and what does not fit (exit 6).
        """
        ov = self.board_spec.overlay
        limits = {"dense_int8": {"n_in": ov["dense_max_in"], "n_out": ov["dense_max_out"]},
                  "lstm_int8": {"n_in": ov["lstm_max_in"], "n_hidden": ov["lstm_max_hidden"],
                                "steps": ov["lstm_max_steps"]}}
        for st in self.graph["steps"]:
            where = f"bundle {self.bundle.path}: steps.json step for op #{st.get('op')} ({st.get('kernel')})"
            try:
                problem = self._step_problem(st, limits, int(ov.get("slots", 4)))
            except (KeyError, TypeError, ValueError, IndexError, OverflowError) as exc:
                problem = f"malformed ({type(exc).__name__}: {exc})"
            if problem:
                raise BundleError(f"{where}: {problem}", hint="compile the bundle again for this board")

    def _step_problem(self, st: dict, limits: dict, slots: int) -> str | None:
        """What is wrong with one ``steps.json`` step (None when nothing is); see :meth:`_check_steps`."""
        from edgehft.kernels.fpga.blob import REQUANTIZE
        if st["placement"] == "cpu":
            return None
        if st["placement"] != "fpga" or st["kernel"] not in limits:
            return f"placement {st['placement']!r} / kernel {st['kernel']!r} is not a CPU segment or a kernel of " \
                   f"this overlay ({', '.join(limits)})"
        d, names = st["dims"], ("rows" if st["kernel"] == "dense_int8" else "steps", *limits[st["kernel"]])
        dims = {k: d[k] for k in dict.fromkeys(names)}
        if any(type(v) is not int or v < 1 for v in dims.values()) or type(st["slot"]) is not int:
            return f"dims {dims} and slot {st['slot']!r} must be positive integers"
        if not 0 <= st["slot"] < slots:
            return f"slot {st['slot']} is outside the overlay's {slots} slots"
        for dim, most in limits[st["kernel"]].items():
            if dims[dim] > int(most):
                return f"{dim} {dims[dim]} exceeds the overlay's {most} on {self.board_spec.name}"
        dense = st["kernel"] == "dense_int8"
        n, n_in = (dims["n_out"] if dense else dims["n_hidden"]), dims["n_in"]
        weights = n * n_in if dense else 4 * n * (n_in + n)
        if st["weights_len"] != weights or type(st["weights_len"]) is not int:
            return f"weights_len {st['weights_len']!r} is not the {weights} B its dims read"
        if type(st["params_len"]) is not int:
            return f"params_len {st['params_len']!r} is not an integer"
        for key, itemsize in (("weights", 1), ("params", 4)):
            size = self.bundle.resolve(st[key]).stat().st_size
            if size != st[f"{key}_len"] * itemsize:
                return f"{st[key]} holds {size} B, steps.json says {st[f'{key}_len'] * itemsize}"
        head = np.fromfile(self.bundle.resolve(st["params"]), dtype="<i4", count=8)
        want = [0x54464845, 1, 1 if dense else 2, 32, st["params_len"], n_in, n, REQUANTIZE.get(st["requantize"])]
        if len(head) < 8 or head.tolist() != want:
            return f"{st['params']}'s header {head.tolist()} is not the one its step describes {want}"
        n_x = int(np.prod(st["inputs"][0]["shape"]))
        n_y = int(np.prod(st["outputs"][0]["shape"]))
        rows = dims["rows"] if dense else dims["steps"]
        if n_x != rows * n_in or n_y not in ((rows * n,) if dense else (n, rows * n)):
            return f"input of {n_x} and output of {n_y} values; the kernel's dims read {rows * n_in} and write " \
                   f"{rows * n if dense else n}"
        return None

    def _open_steps(self, pynq, op_resolver: str) -> None:
        self._check_steps()
        mod, _, _ = load_interpreter_module()
        self._steps = []
        for st in self.graph["steps"]:
            if st["placement"] == "cpu":
                check_model_file(self.bundle.path / st["model"])            # before LiteRT reads it
                with quiet_runtime_info():
                    it = mod.Interpreter(model_path=str(self.bundle.path / st["model"]), num_threads=self.threads)
                    it.allocate_tensors()
                ins = [d["index"] for d in it.get_input_details()]
                outs = [d["index"] for d in it.get_output_details()]
                stateful = bool(variable_tensors(self.bundle.path / st["model"]))   # an LSTM left on the CPU
                self._steps.append(("cpu", st, (it, ins, outs, stateful)))
                continue
            ip = self.ips[st["kernel"]]
            w = np.fromfile(self.bundle.path / st["weights"], dtype=np.int8)
            p = np.fromfile(self.bundle.path / st["params"], dtype=np.int32)
            bufs = {"weights": pynq.allocate(w.shape, np.int8), "params": pynq.allocate(p.shape, np.int32),
                    "x": pynq.allocate(tuple(st["inputs"][0]["shape"]), np.int8),
                    "y": pynq.allocate(tuple(st["outputs"][0]["shape"]), np.int8)}
            bufs["weights"][:] = w
            bufs["params"][:] = p
            bufs["weights"].flush()
            bufs["params"].flush()
            args = {**st["dims"], "weights": bufs["weights"].physical_address,
                    "params": bufs["params"].physical_address, "x": bufs["x"].physical_address,
                    "y": bufs["y"].physical_address, "slot": st["slot"]}
            ip.call(mode=0, **args)                               # weights into on-chip slot, once
            self._steps.append(("fpga", st, (ip, bufs, {**args, "mode": 1})))

    # -- run -----------------------------------------------------------------------------------------
    @staticmethod
    def run_step(kind: str, st: dict, h, env: dict) -> None:
        """Run one step of the chain: a CPU segment on LiteRT, or an overlay kernel call with its buffer
        copies (flush before, invalidate after); reads its inputs from and puts its outputs into ``env``
        (tensor name -> array; a kernel's output is its device buffer, valid until its next call)."""
        if kind == "cpu":
            it, ins, outs, stateful = h
            for idx, t in zip(ins, st["inputs"]):
                it.set_tensor(idx, env[t["name"]])
            if stateful:
                it.reset_all_variables()
            it.invoke()
            for idx, t in zip(outs, st["outputs"]):
                env[t["name"]] = it.get_tensor(idx)
        else:
            ip, bufs, args = h
            bufs["x"][:] = env[st["inputs"][0]["name"]].reshape(bufs["x"].shape)
            bufs["x"].flush()
            ip.call(**args)
            bufs["y"].invalidate()
            env[st["outputs"][0]["name"]] = np.asarray(bufs["y"])

    @property
    def chain_input_names(self) -> list[str]:
        return [t["name"] for t in self.graph["inputs"]]

    def profile_target(self) -> dict:
        """The steps of ``steps.json`` (CPU segments, FPGA kernel calls with their copies), each through
        :meth:`run_step` (see :meth:`edgehft.runtime.base.Runner.profile_target`)."""
        return {"steps": self._steps, "input_names": self.chain_input_names, "run_step": self.run_step}

    def _invoke(self) -> None:
        env = {t["name"]: buf for t, buf in zip(self.graph["inputs"], self._staging_in)}
        for kind, st, h in self._steps:
            self.run_step(kind, st, h, env)
        for t, buf in zip(self.graph["outputs"], self._staging_out):
            np.copyto(buf, env[t["name"]].reshape(buf.shape))

    def describe(self) -> dict:
        d = super().describe()
        # the ARM segments' interpreter (the overlay's int8 kernels compute what TFLite's reference kernels do):
        # check_golden records it, so a refusal on another interpreter release names both releases
        d.update(backend="pynq", overlay=self.board_spec.overlay["name"], interpreter=interpreter_path("auto"),
                 steps=[f"{s['placement']}:{s.get('kernel', 'litert')}" for _, s, _ in self._steps])
        if self.device is not None:
            d.update(note=self.device.describe()["note"], device=self.device.describe())
        return d

    def close(self) -> None:
        for kind, _, h in getattr(self, "_steps", []):
            if kind == "fpga":
                for b in h[1].values():
                    b.freebuffer()
        self._steps = []
        if self._installed is not None:
            self._installed.restore()
            self._installed = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
        super().close()


def _hwh_interface() -> Path:
    from edgehft.emulate.hwh import interface_path
    return interface_path()


__all__ = ["Runner", "driver_classes"]
