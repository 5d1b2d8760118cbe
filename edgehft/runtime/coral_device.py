"""The Edge TPU runtime library (libedgetpu) through ctypes: presence, version, attached devices.

No pycoral is needed. libedgetpu's C API (``edgetpu_c.h``) used here::

    enum edgetpu_device_type { EDGETPU_APEX_PCI = 0, EDGETPU_APEX_USB = 1 };
    struct edgetpu_device { enum edgetpu_device_type type; const char* path; };
    struct edgetpu_device* edgetpu_list_devices(size_t* num_devices);
    void edgetpu_free_devices(struct edgetpu_device* dev);
    const char* edgetpu_version(void);   // "BuildLabel(COMPILER=...), RuntimeVersion(14)"

The delegate itself is loaded by the TFLite interpreter (``load_delegate``), see ``coral.py``.
"""
from __future__ import annotations

import ctypes
import re
import sys

from edgehft.errors import BoardUnavailableError, InputError

DEVICE_TYPES = {0: "pci", 1: "usb"}
_DEVICE_RE = re.compile(r"^(usb|pci)(?::(\d+))?$")
_VERSION_RE = re.compile(r"RuntimeVersion\((\d+)\)")

INSTALL_HINT = (
    "libedgetpu comes from Coral's own package repository, not from PyPI. Debian/Ubuntu: add "
    "`deb https://packages.cloud.google.com/apt coral-edgetpu-stable main` to "
    "/etc/apt/sources.list.d/coral-edgetpu.list (key: https://packages.cloud.google.com/apt/doc/apt-key.gpg), "
    "then `sudo apt-get update && sudo apt-get install libedgetpu1-std` (or libedgetpu1-max for the "
    "maximum clock); macOS/Windows: install the edgetpu_runtime archive from https://coral.ai/software. "
    "edgehft does not need pycoral; if you want it, it too comes from Coral's repository (`apt-get install python3-pycoral`, or pip install pycoral "
    "--extra-index-url https://google-coral.github.io/py-repo/); the PyPI package named `pycoral` is an "
    "unrelated project. Or pass --emulate to run the int8 model on the CPU.")


class EdgeTPUDevice(ctypes.Structure):
    """``struct edgetpu_device { enum edgetpu_device_type type; const char* path; }``."""

    _fields_ = [("type", ctypes.c_int), ("path", ctypes.c_char_p)]


def library_name(platform: str | None = None) -> str:
    """The runtime library's file name on ``platform`` (default ``sys.platform``): ``libedgetpu.so.1``
    (Linux), ``libedgetpu.1.dylib`` (macOS), ``edgetpu.dll`` (Windows)."""
    platform = platform or sys.platform
    if platform.startswith("darwin"):
        return "libedgetpu.1.dylib"
    if platform.startswith(("win32", "cygwin")):
        return "edgetpu.dll"
    return "libedgetpu.so.1"


def load_library(path: str | None = None) -> ctypes.CDLL:
    """Load the Edge TPU runtime: ``path`` if given, else :func:`library_name` from the system's
    library search path.

    Raises:
        BoardUnavailableError: the library cannot be loaded (exit code 7), with the install hint.
    """
    name = str(path) if path else library_name()
    try:
        return ctypes.CDLL(name)
    except OSError as exc:
        what = f"at {name}" if path else f"({name})"
        raise BoardUnavailableError(f"the Edge TPU runtime library {what} is not installed or cannot be "
                                    f"loaded: {exc}", hint=INSTALL_HINT) from None


def library_path(lib: ctypes.CDLL) -> str:
    """The file the loaded library came from (via ``dladdr`` where available), else its load name."""
    name = getattr(lib, "_name", None) or "?"
    if sys.platform.startswith(("linux", "darwin")):
        class _DlInfo(ctypes.Structure):
            _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                        ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]
        try:
            dladdr = ctypes.CDLL(None).dladdr
            dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
            dladdr.restype = ctypes.c_int
            addr = ctypes.cast(lib.edgetpu_version, ctypes.c_void_p).value
            info = _DlInfo()
            if addr and dladdr(addr, ctypes.byref(info)) and info.dli_fname:
                return info.dli_fname.decode(errors="replace")
        except (AttributeError, OSError):
            pass
    return name


def _symbol(lib: ctypes.CDLL, name: str):
    try:
        return getattr(lib, name)
    except AttributeError:
        raise BoardUnavailableError(
            f"{library_path(lib)} does not export {name}(): it is not the Edge TPU runtime library",
            hint=INSTALL_HINT) from None


def runtime_version(lib: ctypes.CDLL) -> int:
    """The runtime version N from ``edgetpu_version()`` (``"..., RuntimeVersion(N)"``).

    Raises:
        BoardUnavailableError: the symbol is missing or the string has no ``RuntimeVersion(N)``.
    """
    fn = _symbol(lib, "edgetpu_version")
    fn.argtypes, fn.restype = [], ctypes.c_char_p
    raw = fn()
    text = raw.decode("utf-8", "replace") if raw else ""
    m = _VERSION_RE.search(text)
    if not m:
        raise BoardUnavailableError(f"cannot read the Edge TPU runtime version from edgetpu_version() = "
                                    f"{text!r}", hint="reinstall libedgetpu1-std from Coral's repository")
    return int(m.group(1))


def version_string(lib: ctypes.CDLL) -> str:
    """The full ``edgetpu_version()`` string (empty if the symbol is missing)."""
    try:
        fn = _symbol(lib, "edgetpu_version")
    except BoardUnavailableError:
        return ""
    fn.argtypes, fn.restype = [], ctypes.c_char_p
    raw = fn()
    return raw.decode("utf-8", "replace") if raw else ""


def list_devices(lib: ctypes.CDLL) -> list[dict]:
    """The Edge TPUs the runtime sees, in its order: ``{"type": "usb"|"pci", "path": str, "name":
    "usb:0"}``, numbered per type (the names libedgetpu's ``device`` delegate option takes).

    Raises:
        BoardUnavailableError: the library lacks ``edgetpu_list_devices``/``edgetpu_free_devices``.
    """
    lister, free = _symbol(lib, "edgetpu_list_devices"), _symbol(lib, "edgetpu_free_devices")
    lister.argtypes, lister.restype = [ctypes.POINTER(ctypes.c_size_t)], ctypes.POINTER(EdgeTPUDevice)
    free.argtypes, free.restype = [ctypes.POINTER(EdgeTPUDevice)], None
    num = ctypes.c_size_t(0)
    arr = lister(ctypes.byref(num))
    devices, counts = [], {}
    if not arr:
        return devices
    try:
        for i in range(num.value):
            d = arr[i]
            kind = DEVICE_TYPES.get(int(d.type), f"type{int(d.type)}")
            k = counts.get(kind, 0)
            counts[kind] = k + 1
            devices.append({"type": kind, "path": d.path.decode("utf-8", "replace") if d.path else "",
                            "name": f"{kind}:{k}"})
    finally:
        free(arr)
    return devices


def parse_device(spec: str | None) -> tuple[str | None, int | None]:
    """Validate a device selector: ``"usb"``, ``"usb:N"``, ``"pci"``, ``"pci:N"``, or ``""``/None (any).

    Returns:
        ``(type, index)``: type ``"usb"``/``"pci"`` or None for any; index None for the first one.
    Raises:
        InputError: anything else.
    """
    if spec is None or str(spec).strip() == "":
        return None, None
    m = _DEVICE_RE.match(str(spec).strip().lower())
    if not m:
        raise InputError(f"invalid Edge TPU device {spec!r}",
                         hint="use usb, usb:N, pci or pci:N (N counts devices of that type from 0), "
                              "or leave it empty for the first Edge TPU found")
    return m.group(1), (int(m.group(2)) if m.group(2) is not None else None)


def find_device(devices: list[dict], spec: str | None) -> dict | None:
    """The device in ``devices`` (from :func:`list_devices`) that ``spec`` selects, or None.

    Raises:
        InputError: ``spec`` is not a valid selector.
    """
    kind, index = parse_device(spec)
    matches = [d for d in devices if kind is None or d["type"] == kind]
    i = index or 0
    return matches[i] if i < len(matches) else None


def describe_devices(devices: list[dict]) -> str:
    """``"usb:0 (/sys/bus/usb/...), pci:0 (/dev/apex_0)"`` or ``"none"``."""
    return ", ".join(f"{d['name']} ({d['path']})" for d in devices) or "none"


def probe(path: str | None = None) -> dict:
    """What this machine has, for ``edgehft boards --probe``; never raises.

    Returns:
        ``{"library": path or None, "runtime_version": int | None, "version_string": str | None,
        "devices": [...], "error": str | None, "hint": str | None}``.
    """
    out = {"library": None, "runtime_version": None, "version_string": None, "devices": [], "error": None,
           "hint": None}
    try:
        lib = load_library(path)
        out["library"] = library_path(lib)
        out["version_string"] = version_string(lib) or None
        out["runtime_version"] = runtime_version(lib)
        out["devices"] = list_devices(lib)
    except Exception as exc:  # noqa: BLE001 - a probe reports, it does not fail
        out["error"] = str(exc.args[0]) if exc.args else repr(exc)
        out["hint"] = getattr(exc, "hint", None)
    return out
