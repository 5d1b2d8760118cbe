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

from edgehft.emulate.base import DeviceMemory, EmulatedBusError, EmulationError, KernelModel
from edgehft.errors import BoardUnavailableError


_PYNQ_NAMES = {"EmulatedPynqDevice", "install", "Installed", "write_placeholder_bit"}


def __getattr__(name: str):
    if name in _PYNQ_NAMES:
        try:
            from edgehft.emulate import pynq_board
        except ImportError as exc:       # pragma: no cover - exercised only where pynq is absent
            raise BoardUnavailableError(
                f"edgehft.emulate.{name} needs pynq ({exc})",
                hint="pynq 4.0.0 pins numpy < 2 and cannot share TensorFlow's venv: make one with "
                     "`python -m edgehft.emulate.board_venv VENV` and use VENV/bin/python") from exc
        return getattr(pynq_board, name)
    raise AttributeError(f"module 'edgehft.emulate' has no attribute {name!r}")


__all__ = ["EmulationError", "EmulatedBusError", "DeviceMemory", "KernelModel", *sorted(_PYNQ_NAMES)]
