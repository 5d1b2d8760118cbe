"""Emulated boards: the vendor's own driver stack, run in-process against a model of the hardware.

:mod:`edgehft.emulate.pynq_board` -- ``EmulatedPynqDevice``, a ``pynq.Device`` that serves the edgehft
overlay's kernels (described by an emulation ``.hwh`` from ``bitstreams/recipes/emulation_hwh.py``) so
that pynq 4.0.0's real ``Overlay``, ``DefaultIP`` binding, ``register_map``, ``MMIO`` and ``allocate`` run
unmodified on a machine with no FPGA. Timing is not modelled; register and memory behaviour is.

Importing this package never imports pynq (the main venv has none: pynq pins numpy < 2); the names
below that need it are loaded on first use, and without pynq they raise ``BoardUnavailableError``
saying how to get it. The exceptions and the kernel-model protocol need nothing.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

from edgehft.errors import BoardUnavailableError, EdgeHFTError


class EmulationError(EdgeHFTError):
    """The emulated board was used in a way the hardware would not support (no kernel model for an
    IP, a .hwh that is not the emulated design, an unsupported control bit, a failing kernel model)."""

    exit_code = 7


class EmulatedBusError(EmulationError):
    """An AXI decode error: a register access outside every mapped IP (or, with ``strict_registers``,
    on an offset that is no register), or a kernel's memory access outside every allocated buffer.
    On a board the first is a bus error or a hang; the second reads or corrupts someone else's memory."""


@runtime_checkable
class DeviceMemory(Protocol):
    """What a kernel model gets to touch: the emulated board's device-side DDR (never host memory).
    Both methods raise :class:`EmulatedBusError` when ``[addr, addr + nbytes)`` is not inside one
    allocated buffer."""

    def read(self, addr: int, nbytes: int) -> bytes: ...

    def write(self, addr: int, data: bytes) -> None: ...


@runtime_checkable
class KernelModel(Protocol):
    """A model of one HLS kernel. ``run`` is called synchronously when the driver writes ap_start.

    Args:
        args: the argument registers by name as in ``interface.toml`` (``"n_in"``, ``"x"``...); 32-bit
            scalars as written, 64-bit pointers assembled from their low and high words.
        mem: the board's device memory (reads see only what was flushed; writes are seen by the host
            only after ``invalidate``).
    """

    def run(self, args: dict[str, int], mem: DeviceMemory) -> None: ...


_PYNQ_NAMES = {"EmulatedPynqDevice", "install", "Installed", "write_placeholder_bit"}


def __getattr__(name: str):
    if name in _PYNQ_NAMES:
        try:
            from edgehft.emulate import pynq_board
        except ImportError as exc:       # pragma: no cover - exercised only where pynq is absent
            raise BoardUnavailableError(
                f"edgehft.emulate.{name} needs pynq ({exc})",
                hint="pynq 4.0.0 pins numpy < 2 and cannot share TensorFlow's venv: run "
                     "scripts/board-venv.sh and use .venv-board/bin/python") from exc
        return getattr(pynq_board, name)
    raise AttributeError(f"module 'edgehft.emulate' has no attribute {name!r}")


__all__ = ["EmulationError", "EmulatedBusError", "DeviceMemory", "KernelModel", *sorted(_PYNQ_NAMES)]
