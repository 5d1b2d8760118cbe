"""What the emulated boards and their kernel models share: the errors an emulated board raises and the
kernel-model protocol. Needs nothing beyond edgehft's errors (no pynq)."""
from __future__ import annotations

from typing import Protocol, runtime_checkable

from edgehft.errors import EdgeHFTError


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
