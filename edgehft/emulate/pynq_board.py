"""An emulated PYNQ board: a ``pynq.Device`` with capability ``REGISTER_RW`` that serves the overlay an
emulation ``.hwh`` describes, so pynq 4.0.0's own ``Overlay``, ``DefaultIP`` (``bindto``),
``register_map``, ``MMIO`` and ``allocate`` run unmodified without an FPGA.

    dev = EmulatedPynqDevice(hwh, {"edgehft:hls:dense_int8:1.0": model}, board="Pynq-Z2")
    bit = write_placeholder_bit(hwh)          # <overlay>.bit: a placeholder, no bitstream is built here
    with install(dev):
        ol = pynq.Overlay(str(bit))
        ...                                   # allocate / flush / register_map / ap_start / invalidate

What is modelled:
- every HLS IP the PS maps (its ``MEMORYMAP``): CTRL (0x00; ap_start runs the kernel model synchronously,
  then ap_done (clear on read), ap_idle and ap_ready (clear on read) are set), GIER/IP_IER/IP_ISR, and
  the argument registers the .hwh lists; offsets that are no register read 0 and ignore writes, as HLS
  RTL does (``strict_registers=True`` raises instead);
- device memory apart from host memory: ``allocate`` returns real ``PynqBuffer`` s with
  ``coherent=False``; ``flush`` copies host -> device, ``invalidate`` device -> host; kernels see only
  device memory, so a missing flush or invalidate gives a wrong result, as on the board;
- the PS clock registers pynq's ``Clocks`` programs (Zynq-7000 SLCR, UltraScale+ CRL_APB/CRF_APB), in
  the state a PYNQ image boots in (PL clock 0 = 100 MHz from the IO PLL), so ``Overlay.download()``
  runs pynq's real clock code and ``Clocks.fclk0_mhz`` reads what it programmed.
Not modelled: timing, interrupts (pynq needs UIO for those; poll ap_done), the AXI DMA.
"""
from __future__ import annotations

import ctypes
import os
import weakref
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

import pynq
from pynq.buffer import PynqBuffer
from pynq.pl_server.remote_device import RemoteBitstreamHandler
from pynq.ps import Clocks

from edgehft.emulate.base import EmulatedBusError, EmulationError, KernelModel

PLACEHOLDER = (b"edgehft emulation placeholder: NOT a bitstream. No bitstream is built here; pynq.Overlay "
               b"needs a file with the .hwh's stem, and EmulatedPynqDevice never programs anything.\n")
PS_MODTYPES = {"processing_system7": ("zynq", "armv7l"), "zynq_ultra_ps_e": ("zynquplus", "aarch64")}
CONTROL_REGS = {"CTRL", "GIER", "IP_IER", "IP_ISR"}
_MISSING = object()


def write_placeholder_bit(hwh: Path) -> Path:
    """Write ``<stem>.bit`` next to ``hwh`` -- a text placeholder, not a bitstream -- so that
    ``pynq.Overlay`` (which wants a .bit with the .hwh's stem) can be opened on the emulated board."""
    bit = Path(hwh).with_suffix(".bit")
    bit.write_bytes(PLACEHOLDER)
    return bit


class _Handler(RemoteBitstreamHandler):
    """pynq's bitstream handler without the .bit parsing (our .bit is a placeholder) and without
    xclbinutil (it uses pynq's default xclbin, as PYNQ.remote does)."""

    def get_bin_data(self):
        return self._filepath.read_bytes()


class _Memory:
    """The device memory a kernel model sees (``edgehft.emulate.DeviceMemory``), bound to one IP."""

    def __init__(self, device: "EmulatedPynqDevice", ip: str):
        self._device, self._ip = device, ip

    def read(self, addr: int, nbytes: int) -> bytes:
        buf, off = self._device._locate(addr, nbytes, f"{self._ip}: kernel read")
        return bytes(buf.data[off:off + nbytes])

    def write(self, addr: int, data: bytes) -> None:
        buf, off = self._device._locate(addr, len(data), f"{self._ip}: kernel write")
        buf.data[off:off + len(data)] = bytes(data)


@dataclass
class _Buffer:
    phys: int
    nbytes: int
    data: object          # bytearray (cacheable) or a ctypes view of host memory (coherent)


@dataclass
class _HlsIp:
    """One HLS block: its registers (name -> (offset, bits)) and its ap_ctrl_hs state."""
    name: str
    vlnv: str
    base: int
    size: int
    registers: dict
    model: KernelModel | None
    words: dict = field(default_factory=dict)
    ctrl: int = 0x4                      # ap_idle after reset
    starts: int = 0

    def reset(self) -> None:
        self.words, self.ctrl = {0x04: 0, 0x08: 0, 0x0C: 0}, 0x4
        for off, bits in self.registers.values():
            for w in range(0, bits // 8, 4):
                self.words.setdefault(off + w, 0)

    def read(self, off: int, strict: bool) -> int:
        if off == 0x00:
            value = self.ctrl
            self.ctrl &= ~0xA                # ap_done and ap_ready clear on read
            return value
        if off not in self.words and strict:
            raise EmulatedBusError(f"{self.name}: read at offset {off:#x} is no register of {self.vlnv}")
        return self.words.get(off, 0)

    def write(self, device: "EmulatedPynqDevice", off: int, value: int, strict: bool) -> None:
        if off == 0x00:
            self.ctrl = (self.ctrl & ~0x80) | (value & 0x80)
            if value & 0x80:
                raise EmulationError(f"{self.name}: auto_restart (CTRL bit 7) is not emulated",
                                     hint="start each call with ap_start and poll ap_done")
            if value & 0x1:
                self.start(device)
        elif off == 0x0C:
            self.words[0x0C] ^= value & 0x3  # IP_ISR: toggle on write
        elif off in self.words:
            self.words[off] = value
        elif strict:
            layout = ", ".join(f"{n}@{o:#x}" for n, (o, _) in sorted(self.registers.items(), key=lambda r: r[1]))
            raise EmulatedBusError(f"{self.name}: write of {value:#x} at offset {off:#x} is no register of "
                                   f"{self.vlnv} (registers: {layout})")
        else:
            device.ignored_writes.append((self.name, off, value))

    def start(self, device: "EmulatedPynqDevice") -> None:
        if self.model is None:
            raise EmulationError(f"{self.name} ({self.vlnv}) was started but the emulated board has no "
                                 "kernel model for it", hint=f"pass kernels={{{self.vlnv!r}: model}}")
        args = {}
        for name, (off, bits) in self.registers.items():
            if name not in CONTROL_REGS:
                args[name] = self.words[off] | (self.words[off + 4] << 32 if bits == 64 else 0)
        self.starts += 1
        self.ctrl = (self.ctrl & ~0x4) | 0x1            # running
        try:
            self.model.run(args, _Memory(device, self.name))
        except EmulationError:
            raise
        except Exception as exc:
            raise EmulationError(f"{self.name}: kernel model {type(self.model).__name__} failed: {exc!r}") from exc
        finally:
            self.ctrl = (self.ctrl & ~0x1) | 0x4        # ap_start clears on handshake; idle again
        self.ctrl |= 0x2 | 0x8                          # ap_done, ap_ready
        self.words[0x0C] |= self.words[0x08] & 0x3      # IP_ISR latches what IP_IER enables


class _PsClocks:
    """The PS clock-control registers pynq's ``Clocks`` reads and writes: a plain register file."""

    def __init__(self, name: str, base: int, words: dict):
        self.name, self.base, self.size, self.words = name, base, 0x1000, dict(words)

    def reset(self) -> None:
        pass

    def read(self, off: int, strict: bool) -> int:
        return self.words.get(off, 0)

    def write(self, device, off: int, value: int, strict: bool) -> None:
        self.words[off] = value


def _ps_clock_blocks(family: str, params: dict) -> list[_PsClocks]:
    """Clock registers as a PYNQ image boots them: PLLs as the design's PS configures them (defaults
    where the .hwh says nothing), PL clocks 0-3 at 100 MHz from the IO PLL."""
    p = lambda key, default: int(params.get(key, default))  # noqa: E731
    if family == "zynq":       # SLCR: PLL_FDIV at bit 12; FPGAn_CLK_CTRL: DIV1 <<20, DIV0 <<8, SRCSEL <<4
        io = p("PCW_IOPLL_CTRL_FBDIV", 20)
        words = {0x100: p("PCW_ARMPLL_CTRL_FBDIV", 26) << 12, 0x104: p("PCW_DDRPLL_CTRL_FBDIV", 21) << 12,
                 0x108: io << 12, 0x120: 2 << 8}
        div0 = max(1, min(63, round(50 * io / 100)))
        words.update({0x170 + 0x10 * i: (1 << 20) | (div0 << 8) for i in range(4)})
        return [_PsClocks("SLCR", 0xF8000000, words)]
    pll = lambda fb, div2: (div2 << 16) | (fb << 8)  # noqa: E731  PRE_SRC 0 (PS_REF_CLK)
    io = p("PSU__CRL_APB__IOPLL_CTRL__FBDIV", 90)
    io_div2 = p("PSU__CRL_APB__IOPLL_CTRL__DIV2", 1)
    crl = {0x20: pll(io, io_div2), 0x30: pll(p("PSU__CRL_APB__RPLL_CTRL__FBDIV", 72),
                                              p("PSU__CRL_APB__RPLL_CTRL__DIV2", 1))}
    div0 = max(1, min(63, round(100 / 3 * io / (1 + io_div2) / 100)))
    crl.update({0xC0 + 4 * i: (1 << 24) | (1 << 16) | (div0 << 8) for i in range(4)})
    crf = {0x20: pll(80, 1), 0x2C: pll(p("PSU__CRF_APB__DPLL_CTRL__FBDIV", 126),
                                       p("PSU__CRF_APB__DPLL_CTRL__DIV2", 1)), 0x38: pll(90, 1), 0x60: 1 << 8}
    return [_PsClocks("CRL_APB", 0xFF5E0000, crl), _PsClocks("CRF_APB", 0xFD1A0000, crf)]


class EmulatedPynqDevice(pynq.Device):
    """A PYNQ board that exists only in this process. See the module docstring for what is modelled.

    Args:
        hwh: the overlay's hardware handoff (an emulation .hwh, or a real one with HLS IPs).
        kernels: ``{vlnv: kernel model}``; an IP with no model answers its registers but raises
            :class:`EmulationError` when started. A VLNV the .hwh does not contain raises at once
            (a version bump must be deliberate).
        board: what pynq reports as the board name (``Device.name``), e.g. ``"Pynq-Z2"``.
        strict_registers: raise :class:`EmulatedBusError` on an access to an offset inside an IP's range
            that is no register, instead of ignoring it as the RTL does.
    Attributes:
        starts: ``{ip instance: number of ap_start}``; ``ignored_writes``: ``[(ip, offset, value)]``
            written to offsets that are no register; ``flushes`` / ``invalidates``: counts.
    Raises:
        EmulationError: the .hwh has no Zynq processing system, or ``kernels`` names an unknown VLNV.
    """

    def __init__(self, hwh: Path | str, kernels: dict[str, KernelModel], *, board: str | None = None,
                 strict_registers: bool = False):
        self.hwh = Path(hwh).resolve()
        root = ET.parse(self.hwh).getroot()
        super().__init__(f"edgehft-emulated:{self.hwh.stem}")
        self.capabilities = {"REGISTER_RW": True}
        self.strict_registers = strict_registers
        mods = {m.get("INSTANCE"): m for m in root.iter("MODULE")}
        ps = next((m for m in mods.values() if m.get("MODTYPE") in PS_MODTYPES), None)
        if ps is None:
            raise EmulationError(f"{self.hwh}: no Zynq-7000 or Zynq UltraScale+ processing system")
        self.family, self.arch = PS_MODTYPES[ps.get("MODTYPE")]
        self.name = board or f"emulated {self.hwh.stem}"
        info = root.find("SYSTEMINFO")
        self.part = "".join(info.get(k, "") for k in ("DEVICE", "PACKAGE", "SPEEDGRADE")) if info is not None else ""
        self.ps_params = {p.get("NAME"): p.get("VALUE") for p in ps.findall("./PARAMETERS/PARAMETER")}
        self.ips: dict[str, _HlsIp] = {}
        for mr in ps.iter("MEMRANGE"):
            mod = mods.get(mr.get("INSTANCE"))
            if mr.get("MEMTYPE") != "REGISTER" or mod is None:
                continue
            base = int(mr.get("BASEVALUE"), 16)
            regs = {}
            for block in mod.iter("ADDRESSBLOCK"):
                if block.get("INTERFACE", "").lower() == (mr.get("SLAVEBUSINTERFACE") or "").lower():
                    for reg in block.iter("REGISTER"):
                        prop = {q.get("NAME"): q.get("VALUE") for q in reg.findall("PROPERTY")}
                        regs[reg.get("NAME")] = (int(prop["ADDRESS_OFFSET"], 0), int(prop.get("SIZE", 32)))
            if regs.get("CTRL", (None,))[0] != 0:     # not an HLS ap_ctrl block: left unmapped
                continue
            self.ips[mod.get("INSTANCE")] = _HlsIp(mod.get("INSTANCE"), mod.get("VLNV"), base,
                                                   int(mr.get("HIGHVALUE"), 16) - base + 1, regs, None)
        known = {ip.vlnv for ip in self.ips.values()}
        unknown = sorted(set(kernels) - known)
        if unknown:
            raise EmulationError(f"kernel models for {unknown} but {self.hwh.name} maps {sorted(known)}",
                                 hint="a bumped IP version must be matched by its model and its driver")
        for ip in self.ips.values():
            ip.model = kernels.get(ip.vlnv)
        self._regions = list(self.ips.values()) + _ps_clock_blocks(self.family, self.ps_params)
        for r in self._regions:
            r.reset()
        self._buffers: dict[int, _Buffer] = {}
        self._next_bo = 1
        self._next_phys = 0x1800_0000 if self.family == "zynq" else 0x6000_0000
        self.ignored_writes: list[tuple[str, int, int]] = []
        self.flushes = self.invalidates = self.downloads = 0

    @property
    def starts(self) -> dict[str, int]:
        return {name: ip.starts for name, ip in self.ips.items()}

    def describe(self) -> dict:
        """What this board is: says it is emulated, the design, the IPs, their models and start counts."""
        fclk = self.ps_params.get("PCW_ACT_FPGA0_PERIPHERAL_FREQMHZ",
                                  self.ps_params.get("PSU__CRL_APB__PL0_REF_CTRL__ACT_FREQMHZ"))
        return {"board": self.name, "emulated": True, "backend": "pynq",
                "note": "emulated PYNQ board (edgehft.emulate): pynq's own driver stack against in-process "
                        "kernel models; registers and memory are modelled, timing is not; no FPGA, no bitstream",
                "hwh": str(self.hwh), "family": self.family, "part": self.part,
                "pl_clock_mhz": float(fclk) if fclk else None,
                "ips": {n: {"vlnv": ip.vlnv, "phys_addr": ip.base, "addr_range": ip.size,
                            "model": type(ip.model).__name__ if ip.model else None, "starts": ip.starts}
                        for n, ip in self.ips.items()},
                "buffers": len(self._buffers)}

    # --- metadata and download (pynq.Overlay) --------------------------------------------------
    def get_bitfile_metadata(self, bitfile_name: str, partial: bool = False):
        """pynq's parser for the design, with the Zynq-7000 PL clock frequency filled in.
        Raises EmulationError when the bitfile's .hwh is not the design this board emulates."""
        hwh = Path(os.path.splitext(bitfile_name)[0] + ".hwh")
        if not hwh.exists() or not (hwh.resolve() == self.hwh or hwh.read_bytes() == self.hwh.read_bytes()):
            raise EmulationError(f"{bitfile_name}: its .hwh is not {self.hwh}, the design this board emulates",
                                 hint="create an EmulatedPynqDevice from that .hwh")
        parser = _Handler(bitfile_name).get_parser(partial=partial)
        ps = parser.ip_dict.get(parser.ps_name, {}).get("parameters", {})
        for i, clk in parser.clock_dict.items():
            # pynqmetadata 0.2.0 (ProcSysCore.clk_freq_param_name) asks every PS for the UltraScale+
            # name PSU__CRL_APB__PLn_REF_CTRL__ACT_FREQMHZ: a Zynq-7000 design parses to None, and
            # Overlay.download() then fails in Clocks.set_pl_clk. Take the Zynq-7000 parameter.
            if clk.get("enable") and clk.get("frequency") is None:
                act = ps.get(f"PCW_ACT_FPGA{i}_PERIPHERAL_FREQMHZ")
                if act is None:
                    raise EmulationError(f"{self.hwh.name}: no frequency for enabled PL clock {i}")
                clk["frequency"] = float(act)
        _forget_clocks(self)
        return parser

    def download(self, bitstream, parser=None) -> None:
        """'Program' the PL: reset every IP's registers (device memory is DDR: it survives)."""
        if parser is None:
            parser = self.get_bitfile_metadata(bitstream.bitfile_name)
        for ip in self.ips.values():
            ip.reset()
        self.downloads += 1
        self.post_download(bitstream, parser, self.name)

    # --- registers (pynq.MMIO with REGISTER_RW calls these) ------------------------------------
    def _region(self, addr: int, length: int):
        for r in self._regions:
            if r.base <= addr and addr + length <= r.base + r.size:
                return r, addr - r.base
        mapped = ", ".join(f"{r.name}@{r.base:#x}+{r.size:#x}" for r in self._regions)
        raise EmulatedBusError(f"register access of {length} bytes at {addr:#x} is outside every mapped IP "
                               f"({mapped})", hint="check the base address against ol.ip_dict")

    def read_registers(self, address: int, length: int) -> bytes:
        region, off = self._region(address, length)
        if off % 4 or length % 4:
            raise EmulatedBusError(f"{region.name}: unaligned register read at {address:#x} ({length} bytes)")
        return b"".join(region.read(off + w, self.strict_registers).to_bytes(4, "little")
                        for w in range(0, length, 4))

    def write_registers(self, address: int, data) -> None:
        data = bytes(data)
        region, off = self._region(address, len(data))
        if off % 4 or len(data) % 4:
            raise EmulatedBusError(f"{region.name}: unaligned register write at {address:#x} ({len(data)} bytes)")
        for w in range(0, len(data), 4):     # a 64-bit store lands as low word, then high word
            region.write(self, off + w, int.from_bytes(data[w:w + 4], "little"), self.strict_registers)

    # --- memory ---------------------------------------------------------------------------------
    def allocate(self, shape, dtype, cacheable: bool = True, **kwargs) -> PynqBuffer:
        """A zeroed ``PynqBuffer`` at a fresh page-aligned physical address, one guard page after the
        previous buffer. Cacheable (default): ``coherent=False`` and a separate device copy that only
        ``flush``/``invalidate`` move data to and from; ``cacheable=False``: coherent, the device reads
        and writes the host memory directly. The device copy is released when the buffer is collected."""
        buf = PynqBuffer(shape, dtype, device=self, device_address=self._next_phys, bo=self._next_bo,
                         coherent=not cacheable)
        nbytes = int(buf.nbytes)
        ctypes.memset(buf.ctypes.data, 0, nbytes)
        data = bytearray(nbytes) if cacheable else (ctypes.c_char * nbytes).from_address(buf.ctypes.data)
        self._buffers[self._next_bo] = _Buffer(self._next_phys, nbytes, data)
        weakref.finalize(buf, self._buffers.pop, self._next_bo, None)
        self._next_bo += 1
        self._next_phys += ((nbytes + 0xFFF) & ~0xFFF) + 0x1000
        return buf

    def _span(self, bo: int, offset: int, nbytes: int) -> _Buffer:
        buf = self._buffers.get(bo)
        if buf is None or offset < 0 or offset + nbytes > buf.nbytes:
            raise EmulationError(f"cache maintenance on bo {bo} [{offset}, +{nbytes}) outside its buffer")
        return buf

    def flush(self, bo: int, offset: int, vaddr: int, nbytes: int) -> None:
        """Host -> device (what the A9/A53 cache flush achieves before the kernel reads)."""
        self.flushes += 1
        self._span(bo, offset, nbytes).data[offset:offset + nbytes] = ctypes.string_at(vaddr, nbytes)

    def invalidate(self, bo: int, offset: int, vaddr: int, nbytes: int) -> None:
        """Device -> host (what the cache invalidate achieves before the CPU reads the kernel's output)."""
        self.invalidates += 1
        ctypes.memmove(vaddr, bytes(self._span(bo, offset, nbytes).data[offset:offset + nbytes]), nbytes)

    def _locate(self, addr: int, nbytes: int, what: str) -> tuple[_Buffer, int]:
        for buf in self._buffers.values():
            if buf.phys <= addr and addr + nbytes <= buf.phys + buf.nbytes:
                return buf, addr - buf.phys
        live = ", ".join(f"{b.phys:#x}+{b.nbytes}" for b in self._buffers.values()) or "none"
        null = " (a null pointer: was the register written at the right offset?)" if addr == 0 else ""
        raise EmulatedBusError(f"{what} of {nbytes} bytes at {addr:#x} is outside every allocated buffer"
                               f"{null}; buffers: {live}")


def _forget_clocks(device) -> None:
    """pynq.ps.Clocks caches its register driver in ``Clocks._real_instance`` for the first device it
    saw and never rebuilds it: drop it when it belongs to another device."""
    inst = Clocks.__dict__.get("_real_instance")
    if inst is not None:
        mmio = getattr(inst, "_slcr_mmio", None) or getattr(inst, "_crl_mmio", None)
        if getattr(mmio, "device", None) is not device:
            del Clocks._real_instance


class Installed:
    """``install(device)``: makes ``device`` pynq's active device (``pynq.Device.active_device``, the
    ``Clocks`` device) until :meth:`restore`, which puts back what was there; also a context manager
    (``with install(dev):``) that restores on exit."""

    def __init__(self, device: EmulatedPynqDevice):
        self.device = device
        self._prev_active = pynq.Device.__dict__.get("_active_device", _MISSING)
        self._prev_clocks = (Clocks.__dict__.get("device", None), Clocks.__dict__.get("_real_instance", _MISSING))
        pynq.Device.active_device = device
        Clocks.set_device(device)
        _forget_clocks(device)

    def restore(self) -> None:
        for cls, attr, value in ((pynq.Device, "_active_device", self._prev_active),
                                 (Clocks, "_real_instance", self._prev_clocks[1])):
            if value is not _MISSING:
                setattr(cls, attr, value)
            elif attr in cls.__dict__:
                delattr(cls, attr)
        Clocks.device = self._prev_clocks[0]

    def __enter__(self) -> EmulatedPynqDevice:
        return self.device

    def __exit__(self, *exc) -> None:
        self.restore()


def install(device: EmulatedPynqDevice) -> Installed:
    """Make ``device`` pynq's active device; returns a handle whose ``restore()`` (or ``with``) undoes it."""
    return Installed(device)
