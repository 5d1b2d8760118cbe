"""pynq's own Overlay / DefaultIP / register_map / MMIO / allocate against the emulated board, for the
emulation .hwh of every PYNQ board (bitstreams/recipes/emulation_hwh.py). The kernel models here are toys
(the int8 kernels come from bitstreams/kernels); they only prove the plumbing.

Each board runs on the pynq its board file's ``[stack]`` names: the ZU+ boards on pynq 4.0 (.venv-board),
the PYNQ-Z2 on pynq 3.1 under Python 3.10 with tflite-runtime (.venv-board-z2: PYNQ 4.0 dropped Zynq-7000);
a test of a board whose stack is not this venv's is skipped with the reason. The plumbing tests that name
no board's stack run in both."""
from __future__ import annotations

import subprocess
import sys
from edgehft.compat import tomllib
import warnings
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pynq
import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from pynq import DefaultIP, Overlay
from pynqmetadata.frontends import Metadata
from pynqmetadata.views.runtime import RuntimeMetadataParser

from edgehft.emulate import EmulatedBusError, EmulationError
from edgehft.emulate.hwh import build_hwh, write_emulation_hwh
from edgehft.emulate.pynq_board import EmulatedPynqDevice, install, write_placeholder_bit

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "bitstreams" / "recipes" / "emulation_hwh.py"
INTERFACE = tomllib.loads((ROOT / "bitstreams" / "kernels" / "interface.toml").read_text())
BOARDS = {b: tomllib.loads((ROOT / "boards" / f"{b}.toml").read_text())
          for b in ("pynq-z2", "kv260", "zcu104", "ultra96")}
BASES = {"zynq": (0x43C00000, 0x43C10000), "zynquplus": (0xA0000000, 0xA0010000)}


def other_stack(name: str) -> str:
    """Why board ``name`` does not run on this venv's pynq (its board file's [stack] pynq specifier), or ""."""
    spec = BOARDS[name].get("stack", {}).get("packages", {}).get("pynq", "")
    if not spec or Version(pynq.__version__) in SpecifierSet(spec):
        return ""
    venv = ".venv-board-z2 (scripts/board-venv.sh z2)" if name == "pynq-z2" else ".venv-board (scripts/board-venv.sh)"
    return f"{name}'s image runs pynq {spec}, this venv has pynq {pynq.__version__}: it runs in {venv}"


def on_their_stacks(names) -> list:
    """``names`` as parameters, each skipped (with the reason) where this venv is not its board's stack."""
    return [pytest.param(n, marks=pytest.mark.skipif(bool(other_stack(n)), reason=other_stack(n))) for n in names]
DENSE, LSTM = INTERFACE["dense_int8"]["vlnv"], INTERFACE["lstm_int8"]["vlnv"]


class CopyPlusOne:
    """Toy dense: y[i] = x[i] + 1 (int8, wrapping) for rows * n_in bytes."""

    def run(self, args, mem):
        n = args["rows"] * args["n_in"]
        x = np.frombuffer(mem.read(args["x"], n), np.int8)
        mem.write(args["y"], (x + np.int8(1)).tobytes())


class Negate:
    """Toy LSTM: y[i] = -x[i] for steps * n_in bytes."""

    def run(self, args, mem):
        n = args["steps"] * args["n_in"]
        mem.write(args["y"], (-np.frombuffer(mem.read(args["x"], n), np.int8)).tobytes())


@pytest.fixture(scope="session")
def hwhs(tmp_path_factory) -> dict[str, Path]:
    """The emulation .hwh (and its placeholder .bit) of every board."""
    out = tmp_path_factory.mktemp("overlays")
    paths = {}
    for b in BOARDS:
        paths[b] = write_emulation_hwh(ROOT / "boards" / f"{b}.toml",
                                              ROOT / "bitstreams" / "kernels" / "interface.toml", out / b)
        write_placeholder_bit(paths[b])
    return paths


@contextmanager
def board(hwhs, name="pynq-z2", kernels=None, quiet=True, **kw):
    """An installed emulated board with the overlay loaded: yields (overlay, device)."""
    kernels = {DENSE: CopyPlusOne(), LSTM: Negate()} if kernels is None else kernels
    dev = EmulatedPynqDevice(hwhs[name], kernels, board=BOARDS[name]["runtime"]["pynq_board"], **kw)
    with install(dev), warnings.catch_warnings():
        if quiet:
            warnings.simplefilter("ignore")
        yield Overlay(str(hwhs[name].with_suffix(".bit"))), dev


def start_and_wait(ip, **args) -> None:
    """The driver protocol: arguments through register_map, ap_start, poll ap_done (no interrupts)."""
    for k, v in args.items():
        setattr(ip.register_map, k, v)
    ip.register_map.CTRL.AP_START = 1
    for _ in range(100):
        if ip.read(0x00) & 0x2:
            return
    raise AssertionError("ap_done never came")


def buffers(n=64, seed=0):
    x, y = pynq.allocate((n,), np.int8), pynq.allocate((n,), np.int8)
    x[:] = np.random.default_rng(seed).integers(-128, 127, n, dtype=np.int8)
    return x, y


def test_cli_writes_a_marked_hwh(tmp_path):
    r = subprocess.run([sys.executable, str(RECIPE), "kv260", str(tmp_path)], capture_output=True, text=True,
                       check=True)
    out = Path(r.stdout.strip())
    assert out == tmp_path / "edgehft_kv260.hwh"
    head = out.read_text().splitlines()[:3]
    assert head[0].startswith("<?xml") and head[1].startswith("<!--")
    assert "Generated by edgehft" in head[1] and "EMULATED kv260" in head[1] and "NOT a Vivado output" in head[1]


def test_overlapping_arguments_are_refused():
    bad = {k: {**v, "args": [*v["args"], {"name": "late", "offset": 0x58, "bits": 32}]}
           for k, v in INTERFACE.items()}                       # 0x58 is inside y (0x54, 12 bytes)
    with pytest.raises(ValueError, match="late"):
        build_hwh(BOARDS["kv260"], bad)


@pytest.mark.parametrize("name", on_their_stacks(BOARDS))
def test_overlay_parses_with_kernels_at_their_addresses(hwhs, name):
    family = BOARDS[name]["fpga"]["family"]
    with board(hwhs, name) as (ol, dev):
        assert ol.is_loaded() and dev.downloads == 1
        for kernel, base in zip(("dense_int8", "lstm_int8"), BASES[family]):
            ip = ol.ip_dict[f"{kernel}_0"]
            assert (ip["type"], ip["phys_addr"], ip["addr_range"]) == (INTERFACE[kernel]["vlnv"], base, 0x10000)
        ps = ol.ip_dict[{"zynq": "processing_system7_0", "zynquplus": "zynq_ultra_ps_e_0"}[family]]
        assert ps["type"].split(":")[2] == {"zynq": "processing_system7", "zynquplus": "zynq_ultra_ps_e"}[family]
        d = dev.describe()
        assert d["emulated"] is True and "emulated" in d["note"] and d["board"] == BOARDS[name]["runtime"]["pynq_board"]
        assert d["pl_clock_mhz"] == BOARDS[name]["fpga"]["fabric_clock_mhz"]


@pytest.mark.parametrize("name", on_their_stacks(BOARDS))
def test_pl_clock_frequency_is_the_boards(hwhs, name):
    mhz = BOARDS[name]["fpga"]["fabric_clock_mhz"]
    raw = RuntimeMetadataParser(Metadata(input=str(hwhs[name]))).clock_dict[0]["frequency"]
    if BOARDS[name]["fpga"]["family"] == "zynq":
        assert raw is None        # pynqmetadata 0.2.0 reads only the UltraScale+ name; the device fills it in
    else:
        assert raw == mhz
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with board(hwhs, name, quiet=False) as (ol, dev):
            assert ol.clock_dict[0]["frequency"] == mhz
            programmed = pynq.Clocks.fclk0_mhz          # what pynq's Clocks wrote into the emulated PS
    # pynq 4.0.0 programs only the divisors, against the source the PS booted with (IOPLL; 1500 MHz on
    # UltraScale+, 1000 MHz on Zynq-7000) and ignores the .hwh's src_sel: every board's fabric clock is
    # chosen to divide that PLL exactly (Ultra96: 187.5 = 1500/8, not 200, which would land on 214.3).
    assert programmed == pytest.approx(mhz, rel=1e-4)
    assert not any("closest possible value" in str(w.message) for w in caught)


def test_driver_bound_by_exact_vlnv(hwhs):
    class DenseDriver(DefaultIP):
        bindto = [DENSE]

    try:
        with board(hwhs) as (ol, _):
            assert type(ol.dense_int8_0) is DenseDriver
            assert type(ol.lstm_int8_0) is DefaultIP
    finally:
        DenseDriver.unregister()


def test_driver_for_a_bumped_version_is_not_bound(hwhs):
    class DenseDriverNext(DefaultIP):
        bindto = ["edgehft:hls:dense_int8:1.1"]

    try:
        dev = EmulatedPynqDevice(hwhs["pynq-z2"], {DENSE: CopyPlusOne()})
        with install(dev), pytest.warns(UserWarning, match="ignore_version=True"):
            ol = Overlay(str(hwhs["pynq-z2"].with_suffix(".bit")))
        with install(dev):
            # pynq falls back to DefaultIP with only a warning: a driver must check the bound class
            assert type(ol.dense_int8_0) is DefaultIP
    finally:
        DenseDriverNext.unregister()
    with pytest.raises(EmulationError, match="1.1"):
        EmulatedPynqDevice(hwhs["pynq-z2"], {"edgehft:hls:dense_int8:1.1": CopyPlusOne()})


@pytest.mark.skipif(bool(other_stack("zcu104")), reason=other_stack("zcu104"))
@pytest.mark.parametrize("kernel", ["dense_int8", "lstm_int8"])
def test_register_map_matches_interface_toml(hwhs, kernel):
    with board(hwhs, "zcu104") as (ol, _):
        ip = getattr(ol, f"{kernel}_0")
        regs = ol.ip_dict[f"{kernel}_0"]["registers"]
        assert (regs["CTRL"]["address_offset"], regs["CTRL"]["size"]) == (0, 32)
        assert list(regs)[4:] == [a["name"] for a in INTERFACE[kernel]["args"]]
        for arg in INTERFACE[kernel]["args"]:
            assert (regs[arg["name"]]["address_offset"], regs[arg["name"]]["size"]) == (arg["offset"], arg["bits"])
            reg = getattr(ip.register_map, arg["name"])
            assert (reg.address, reg.width) == (arg["offset"], arg["bits"])


@pytest.mark.parametrize("name", on_their_stacks(BOARDS))
def test_round_trip_through_the_toy_kernel(hwhs, name):
    with board(hwhs, name) as (ol, dev):
        ip = ol.dense_int8_0
        x, y = buffers()
        x.flush()
        start_and_wait(ip, rows=1, n_in=64, x=x.physical_address, y=y.physical_address)
        assert ip.read(0x00) & 0x6 == 0x4          # ap_done was cleared by the read that saw it; idle
        y.invalidate()
        np.testing.assert_array_equal(y, x + np.int8(1))
        assert ip.read(0x20) == 64 and ip.read(0x4C) == 0    # n_in as written; x's high word
        assert dev.starts == {"dense_int8_0": 1, "lstm_int8_0": 0}
        start_and_wait(ol.lstm_int8_0, steps=2, n_in=32, x=x.physical_address, y=y.physical_address)
        y.invalidate()
        np.testing.assert_array_equal(y, -x)
        assert dev.starts == {"dense_int8_0": 1, "lstm_int8_0": 1}


def test_forgotten_flush_gives_stale_input(hwhs):
    with board(hwhs) as (ol, _):
        x, y = buffers()
        start_and_wait(ol.dense_int8_0, rows=1, n_in=64, x=x.physical_address, y=y.physical_address)
        y.invalidate()
        np.testing.assert_array_equal(y, np.ones(64, np.int8))    # the kernel saw the device's zeros
        x.flush()
        old = np.array(x)
        x[:] = 7                                                   # new input, not flushed
        start_and_wait(ol.dense_int8_0)
        y.invalidate()
        np.testing.assert_array_equal(y, old + np.int8(1))         # computed on the stale input


def test_forgotten_invalidate_gives_stale_output(hwhs):
    with board(hwhs) as (ol, _):
        x, y = buffers()
        x.flush()
        start_and_wait(ol.dense_int8_0, rows=1, n_in=64, x=x.physical_address, y=y.physical_address)
        np.testing.assert_array_equal(y, np.zeros(64, np.int8))   # host still sees its own copy
        y.invalidate()
        np.testing.assert_array_equal(y, x + np.int8(1))


def test_pointer_written_at_the_wrong_offset(hwhs):
    # x's low word belongs at 0x48; 0x44 is the reserved word after params' high word
    with board(hwhs) as (ol, dev):
        ip = ol.dense_int8_0
        x, y = buffers()
        x.flush()
        ip.write(0x44, x.physical_address)
        with pytest.raises(EmulatedBusError, match="null pointer"):   # fresh board: x is 0 -> DECERR
            start_and_wait(ip, rows=1, n_in=64, y=y.physical_address)
        assert ("dense_int8_0", 0x44, x.physical_address) in dev.ignored_writes
        assert ip.read(0x00) & 0x5 == 0x4                            # idle again, not started
        start_and_wait(ip, x=x.physical_address)                     # a correct call
        x2, _ = buffers(seed=1)
        x2.flush()
        ip.write(0x44, x2.physical_address)                          # the same slip on the next call
        start_and_wait(ip)
        y.invalidate()
        np.testing.assert_array_equal(y, x + np.int8(1))             # silently wrong: the old input
        assert not np.array_equal(y, x2 + np.int8(1))
    with board(hwhs, strict_registers=True) as (ol, _):
        with pytest.raises(EmulatedBusError, match="0x44 is no register"):
            ol.dense_int8_0.write(0x44, 0x1000)


@pytest.mark.skipif(bool(other_stack("kv260")), reason=other_stack("kv260"))
def test_register_access_outside_every_ip(hwhs):
    with board(hwhs, "kv260") as (ol, _):
        with pytest.raises(EmulatedBusError, match="outside every mapped IP"):
            pynq.MMIO(0xA0020000, 0x100).read(0x10)
        with pytest.raises(EmulatedBusError, match="outside every mapped IP"):
            pynq.MMIO(0x43C00000, 0x100).write(0, 1)                   # the Zynq-7000 address


def test_kernel_pointer_outside_every_buffer(hwhs):
    with board(hwhs) as (ol, dev):
        x, y = buffers()
        x.flush()
        with pytest.raises(EmulatedBusError, match="kernel write of 64 bytes .* outside every allocated buffer"):
            start_and_wait(ol.dense_int8_0, rows=1, n_in=64, x=x.physical_address, y=y.physical_address + 32)
        with pytest.raises(EmulatedBusError, match="kernel read"):
            start_and_wait(ol.dense_int8_0, rows=2, y=y.physical_address)   # 128 bytes from a 64-byte x
        gone = y.physical_address
        del y
        with pytest.raises(EmulatedBusError):                          # freed buffers are unmapped
            start_and_wait(ol.dense_int8_0, rows=1, y=gone)
        assert dev.starts["dense_int8_0"] == 3


def test_ip_without_a_model_and_unsupported_control(hwhs):
    with board(hwhs, kernels={DENSE: CopyPlusOne()}) as (ol, _):
        with pytest.raises(EmulationError, match="no kernel model"):
            start_and_wait(ol.lstm_int8_0)
        with pytest.raises(EmulationError, match="auto_restart"):
            ol.dense_int8_0.write(0x00, 0x81)


def test_uncached_buffer_needs_no_maintenance(hwhs):
    with board(hwhs) as (ol, dev):
        x = pynq.allocate((16,), np.int8, cacheable=False)
        y = pynq.allocate((16,), np.int8, cacheable=False)
        assert x.coherent and not buffers()[0].coherent
        x[:] = np.arange(16)
        start_and_wait(ol.dense_int8_0, rows=1, n_in=16, x=x.physical_address, y=y.physical_address)
        np.testing.assert_array_equal(y, np.arange(1, 17))
        assert dev.flushes == dev.invalidates == 0


def test_overlay_of_another_design_is_refused(hwhs):
    dev = EmulatedPynqDevice(hwhs["pynq-z2"], {})
    with install(dev), pytest.raises(EmulationError, match="not .*the design this board emulates"):
        Overlay(str(hwhs["kv260"].with_suffix(".bit")))


def test_install_restores_the_previous_device(hwhs):
    before = pynq.Device.__dict__.get("_active_device")
    a, b = EmulatedPynqDevice(hwhs["pynq-z2"], {}), EmulatedPynqDevice(hwhs["kv260"], {})
    with install(a):
        assert pynq.Device.active_device is a
        handle = install(b)
        assert pynq.Device.active_device is b and pynq.Clocks.device is b
        handle.restore()
        assert pynq.Device.active_device is a
    assert pynq.Device.__dict__.get("_active_device") is before


def test_importing_edgehft_does_not_import_pynq():
    code = ("import sys, edgehft, edgehft.runtime, edgehft.emulate; "
            "assert 'pynq' not in sys.modules, 'pynq imported'; print(edgehft.emulate.EmulatedBusError)")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
