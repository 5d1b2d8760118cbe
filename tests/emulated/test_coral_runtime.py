"""The coral backend: DWN1 packages of real compiled models, libedgetpu discovery, the errors on a
machine without Edge TPU runtime, and emulation bit-identical to the cpu backend.

libedgetpu is not installable here. The discovery code (ctypes) is exercised against a tiny library built
in the test from C, exporting edgetpu_version / edgetpu_list_devices / edgetpu_free_devices with the
documented signatures. It is an emulated libedgetpu for the discovery logic only: it is passed by explicit
path, never put on a search path, and the Runner's real code path never sees it.
"""
import ctypes
import ctypes.util
import io
import json
import shutil
import subprocess
import textwrap

import numpy as np
import pytest

from conftest import SHARED, YAMNET
from edgehft import boards, runtime
from edgehft.bundle import Golden, Manifest, Quantization, SourceModel, TensorSpec, load_bundle, sha256_file, \
    write_bundle
from edgehft.errors import BoardUnavailableError, BundleError, InputError
from edgehft.ir import OpInfo, SubgraphInfo, TFLiteModel
from edgehft.ir.edgetpu_package import EdgeTPUPackage, min_runtime_version, parse_package, read_packages
from edgehft.runtime import coral, coral_device, cpu

PAIRS = SHARED / "edgetpu_pairs" / "google-coral__test_data"
# A real (CPU model, compiled model) pair: 3 uint8 inputs, 5 outputs, numbered differently in the compiled
# model. (keras_lstm_mnist_ptq would not do for golden tests: its LSTM state tensors are variables that
# carry over from one Invoke to the next.)
PAIR = "split_concat"


# -- the DWN1 package of real compiled models --------------------------------------------------------

@pytest.mark.needs("edgetpu-pairs")
def test_packages_of_real_compiled_models():
    compiled = sorted(PAIRS.glob("*_edgetpu.tflite"))
    assert len(compiled) == 13
    for path in compiled:
        m = TFLiteModel.from_file(path)
        pkgs = read_packages(m)
        assert len(pkgs) == 1, path.name
        op, pkg = pkgs[0]
        assert op.custom_code == "edgetpu-custom-op"
        if path.name == "split_concat_edgetpu.tflite":
            assert (pkg.min_runtime_version, pkg.compiler_version) == (13, "cl/343520747")
        else:
            assert (pkg.min_runtime_version, pkg.compiler_version) == (12, "cl/"), path.name
        assert 0 < pkg.executable_bytes < path.stat().st_size
        assert min_runtime_version(m) == pkg.min_runtime_version
        cpu_model = path.with_name(path.name[: -len("_edgetpu.tflite")] + ".tflite")
        assert min_runtime_version(TFLiteModel.from_file(cpu_model)) is None


@pytest.mark.needs("yamnet-pair")
def test_yamnet_package_needs_runtime_14():
    m = TFLiteModel.from_file(YAMNET)
    [(op, pkg)] = read_packages(m)
    assert op.index == 1                      # a CPU op runs before the Edge TPU segment
    assert pkg == EdgeTPUPackage(14, "cl/", pkg.executable_bytes) and pkg.executable_bytes > 4_000_000
    assert min_runtime_version(m) == 14


@pytest.mark.needs("edgetpu-pairs")
def test_malformed_packages_are_input_errors():
    with pytest.raises(InputError, match="no 'DWN1' identifier"):
        parse_package(b"\x0c\x00\x00\x00TFL3" + bytes(20))
    with pytest.raises(InputError, match="root offset"):
        parse_package(b"\xff\xff\x00\x00DWN1" + bytes(20))
    with pytest.raises(InputError, match="no executable"):
        parse_package(b"\x0c\x00\x00\x00DWN1" + bytes(20))
    op = TFLiteModel.from_file(PAIRS / "split_concat_edgetpu.tflite").main.ops[0]
    broken = OpInfo(0, op.name, 1, (), (), op.custom_code, b"\x01\x02\x03")
    with pytest.raises(InputError, match="not a valid FlexBuffer|not a FlexBuffer map"):
        read_packages(_with_ops(op_list=[broken]))
    with pytest.raises(InputError, match="no custom options"):
        read_packages(_with_ops(op_list=[OpInfo(0, op.name, 1, (), (), op.custom_code, b"")]))


def _with_ops(op_list):
    class _Model:                      # read_packages only walks subgraphs' ops
        source = "<test>"
        subgraphs = (SubgraphInfo("main", (), tuple(op_list), (), ()),)
    return _Model()


# -- the Edge TPU runtime library -------------------------------------------------------------------

def test_library_names():
    assert coral_device.library_name("linux") == "libedgetpu.so.1"
    assert coral_device.library_name("darwin") == "libedgetpu.1.dylib"
    assert coral_device.library_name("win32") == "edgetpu.dll"


def _no_libedgetpu() -> bool:
    try:
        ctypes.CDLL(coral_device.library_name())
    except OSError:
        return True
    return False


no_libedgetpu = pytest.mark.skipif(not _no_libedgetpu(), reason="libedgetpu is installed on this machine")


@no_libedgetpu
def test_missing_library_says_where_it_comes_from():
    with pytest.raises(BoardUnavailableError, match="Edge TPU runtime library .* is not installed") as exc:
        coral_device.load_library()
    assert exc.value.exit_code == 7
    hint = exc.value.hint
    assert "deb https://packages.cloud.google.com/apt coral-edgetpu-stable main" in hint
    assert "libedgetpu1-std" in hint and "libedgetpu1-max" in hint and "coral.ai/software" in hint
    assert "python3-pycoral" in hint and "--extra-index-url https://google-coral.github.io/py-repo/" in hint
    assert "the PyPI package named `pycoral` is an unrelated project" in hint
    p = coral_device.probe()
    assert p["library"] is None and p["runtime_version"] is None and p["devices"] == []
    assert "not installed" in p["error"]


@pytest.mark.parametrize("spec,parsed", [(None, (None, None)), ("", (None, None)), ("usb", ("usb", None)),
                                         ("usb:0", ("usb", 0)), ("pci", ("pci", None)), ("pci:3", ("pci", 3))])
def test_parse_device_accepts(spec, parsed):
    assert coral_device.parse_device(spec) == parsed


@pytest.mark.parametrize("spec", ["gpu", "usb:", "usb:-1", "usb:x", ":0", "usb0", "pci:0:1", "tpu:0"])
def test_parse_device_rejects(spec):
    with pytest.raises(InputError, match="invalid Edge TPU device") as exc:
        coral_device.parse_device(spec)
    assert "usb:N" in exc.value.hint


EMULATED_LIBEDGETPU_C = textwrap.dedent(r"""
    /* An EMULATED libedgetpu for edgehft's discovery tests only: the three C API calls, fixed data. */
    #include <stddef.h>
    #include <stdlib.h>
    enum edgetpu_device_type { EDGETPU_APEX_PCI = 0, EDGETPU_APEX_USB = 1 };
    struct edgetpu_device { enum edgetpu_device_type type; const char* path; };
    #include <string.h>
    static char version[128] = "BuildLabel(COMPILER=6.3.0 20170516,DATE=redacted,TIME=redacted), RuntimeVersion(14)";
    static int count = 3, freed = 0;
    const char* edgetpu_version(void) { return version; }
    struct edgetpu_device* edgetpu_list_devices(size_t* num_devices) {
      static const struct edgetpu_device all[3] = {
        {EDGETPU_APEX_USB, "/sys/bus/usb/devices/2-1"}, {EDGETPU_APEX_PCI, "/dev/apex_0"},
        {EDGETPU_APEX_USB, "/sys/bus/usb/devices/2-2"}};
      struct edgetpu_device* d;
      *num_devices = 0;
      if (count == 0) return NULL;
      d = malloc(count * sizeof *d);
      for (int i = 0; i < count; i++) d[i] = all[i];
      *num_devices = (size_t)count;
      return d;
    }
    void edgetpu_free_devices(struct edgetpu_device* dev) { free(dev); freed++; }
    void emulated_set(int n, const char* v) {          /* test control: device count, version string */
      count = n < 0 ? 0 : (n > 3 ? 3 : n);
      if (v) { strncpy(version, v, sizeof version - 1); version[sizeof version - 1] = 0; }
    }
    int emulated_freed(void) { return freed; }
""")


@pytest.fixture(scope="module")
def emulated_lib(tmp_path_factory):
    """Path of the emulated libedgetpu (discovery tests only; passed explicitly, never on a search path)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the emulated libedgetpu")
    d = tmp_path_factory.mktemp("emulated_libedgetpu")
    src = d / "emulated_libedgetpu_for_tests.c"
    src.write_text(EMULATED_LIBEDGETPU_C)
    so = d / "emulated_libedgetpu_for_tests.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-std=c99", "-o", str(so), str(src)], check=True,
                   capture_output=True, timeout=60)
    return so


def test_discovery_against_emulated_library(emulated_lib):
    lib = coral_device.load_library(path=str(emulated_lib))
    lib.emulated_set(3, None)
    assert coral_device.library_path(lib) == str(emulated_lib)
    assert coral_device.runtime_version(lib) == 14
    before = lib.emulated_freed()
    devices = coral_device.list_devices(lib)
    assert lib.emulated_freed() == before + 1                       # the array went back to the library
    assert devices == [{"type": "usb", "path": "/sys/bus/usb/devices/2-1", "name": "usb:0"},
                       {"type": "pci", "path": "/dev/apex_0", "name": "pci:0"},
                       {"type": "usb", "path": "/sys/bus/usb/devices/2-2", "name": "usb:1"}]
    assert coral_device.find_device(devices, "")["name"] == "usb:0"
    assert coral_device.find_device(devices, "pci")["path"] == "/dev/apex_0"
    assert coral_device.find_device(devices, "usb:1")["path"] == "/sys/bus/usb/devices/2-2"
    assert coral_device.find_device(devices, "pci:1") is None
    err = coral.no_device_error(devices, "pci:1")
    assert "Edge TPU 'pci:1' is not attached; attached: usb:0 (/sys/bus/usb/devices/2-1), pci:0" in str(err)
    p = coral_device.probe(path=str(emulated_lib))
    assert (p["library"], p["runtime_version"], p["error"]) == (str(emulated_lib), 14, None)
    assert p["devices"] == devices and "RuntimeVersion(14)" in p["version_string"]

    lib.emulated_set(0, b"BuildLabel(COMPILER=x), RuntimeVersion(12)")
    assert coral_device.list_devices(lib) == []
    assert coral_device.runtime_version(lib) == 12
    assert "attached: none" in str(coral.no_device_error([], None))
    lib.emulated_set(3, b"no version here")
    with pytest.raises(BoardUnavailableError, match="cannot read the Edge TPU runtime version"):
        coral_device.runtime_version(lib)
    assert "cannot read" in coral_device.probe(path=str(emulated_lib))["error"]
    lib.emulated_set(3, b"BuildLabel(COMPILER=6.3.0 20170516,DATE=redacted,TIME=redacted), RuntimeVersion(14)")


def test_a_library_that_is_not_libedgetpu():
    libm = ctypes.util.find_library("m")
    if libm is None:
        pytest.skip("no libm to stand in for a wrong library")
    lib = coral_device.load_library(path=libm)
    with pytest.raises(BoardUnavailableError, match="does not export edgetpu_version"):
        coral_device.runtime_version(lib)
    with pytest.raises(BoardUnavailableError, match="not installed or cannot be loaded"):
        coral_device.load_library(path="/nonexistent/libedgetpu.so.1")


def test_vendor_messages_become_clear_errors():
    e = coral.explain_interpreter_error(RuntimeError(
        "Failed to prepare for TPU. Failed precondition: Package requires runtime version (14), which is "
        "newer than this runtime version (12).Node number 0 (edgetpu-custom-op) failed to prepare."))
    assert isinstance(e, BoardUnavailableError) and "version 12" in str(e) and ">= 14" in str(e)
    assert "edgetpu_compiler -m 12" in e.hint
    e = coral.explain_interpreter_error(ValueError("Failed to load delegate from libedgetpu.so.1\n"),
                                        devices=[], device="usb")
    assert isinstance(e, BoardUnavailableError) and "Edge TPU 'usb' is not attached; attached: none" in str(e)
    assert coral.explain_interpreter_error(RuntimeError("something else")) is None


# -- plain cpu interpreter on a compiled model -------------------------------------------------------

@pytest.mark.needs("edgetpu-pairs")
@pytest.mark.parametrize("name", ["split_concat_edgetpu.tflite", "movenet_single_pose_lightning_ptq_edgetpu.tflite"])
def test_cpu_interpreter_on_compiled_model(name):
    with pytest.raises(BundleError, match="compiled for the Edge TPU .* opened without the Edge TPU delegate") as exc:
        cpu.make_interpreter(PAIRS / name)
    stem = name.replace("_edgetpu.tflite", "")
    assert exc.value.hint == f"open it with board coral-* (Edge TPU delegate) or use the CPU model {stem}.tflite"
    assert isinstance(exc.value.__cause__, RuntimeError)
    assert "unresolved custom op: edgetpu-custom-op" in str(exc.value.__cause__)


# -- coral bundles ------------------------------------------------------------------------------------

CORAL_TOML = """name = "coral-test"
backend = "coral"
quantization = ["int8"]
default_quantization = "int8"
[runtime]
device = "usb"
"""


@pytest.fixture
def coral_board(tmp_path, monkeypatch):
    d = tmp_path / "boards"
    d.mkdir()
    (d / "coral-test.toml").write_text(CORAL_TOML)
    monkeypatch.setattr(boards, "BOARD_DIRS", (d, *boards.BOARD_DIRS))
    return "coral-test"


def _spec(ir, index, name):
    t = ir.main.tensors[index]
    return TensorSpec(name=name, index=index, shape=list(t.shape), dtype=t.dtype,
                      scale=[float(s) for s in t.quant.scale] if t.quant else None,
                      zero_point=[int(z) for z in t.quant.zero_point] if t.quant else None)


def _pair_bundle(out, board, *, compiled=True, accelerator=None):
    """A coral bundle from the real split_concat pair; golden outputs from raw LiteRT."""
    cpu_model, edgetpu_model = PAIRS / f"{PAIR}.tflite", PAIRS / f"{PAIR}_edgetpu.tflite"
    ir = TFLiteModel.from_file(cpu_model)
    ins = [_spec(ir, i, f"in{k}") for k, i in enumerate(ir.main.inputs)]
    outs = [_spec(ir, i, f"out{k}") for k, i in enumerate(ir.main.outputs)]
    rng = np.random.default_rng(7)
    n = 8
    xs = {s.name: rng.integers(0, 256, (n, *s.shape[1:]), dtype=np.uint8) for s in ins}
    interp = cpu.make_interpreter(cpu_model)
    ys = {s.name: [] for s in outs}
    for k in range(n):
        for s in ins:
            interp.set_tensor(s.index, xs[s.name][k:k + 1])
        interp.invoke()
        for s in outs:
            ys[s.name].append(interp.get_tensor(s.index)[0].copy())
    buf = io.BytesIO()
    np.savez(buf, **{f"inputs/{k}": v for k, v in xs.items()},
             **{f"outputs/{k}": np.stack(v) for k, v in ys.items()})
    files = {"model.tflite": cpu_model, "golden.npz": buf.getvalue()}
    m = Manifest(board=board, backend="coral", model_file="model.tflite",
                 source=SourceModel(file=cpu_model.name, sha256=sha256_file(cpu_model), flavour="tf-keras",
                                    lowering="coral test_data"),
                 quantization=Quantization(mode="int8"), inputs=ins, outputs=outs,
                 golden=Golden(count=n, reference_path=cpu.interpreter_path(), compare="exact"))
    if compiled:
        files["model_edgetpu.tflite"] = edgetpu_model
        m.artifacts = {"edgetpu_model": "model_edgetpu.tflite"}
        m.accelerator = accelerator or {"min_runtime_version": 13, "compiler_version": "cl/343520747"}
    return write_bundle(out, m, files).path


def _check_golden(r):
    ins, outs = r.bundle.golden()
    m = r.bundle.manifest
    for k in range(m.golden.count):
        y = r.predict_raw(*(ins[s.name][k:k + 1] for s in m.inputs))
        y = y if isinstance(y, tuple) else (y,)
        assert len(y) == len(m.outputs)
        for got, s in zip(y, m.outputs):
            assert np.array_equal(got, outs[s.name][k:k + 1]), (k, s.name)


@pytest.mark.needs("edgetpu-pairs")
def test_emulated_pair_bundle_reproduces_litert(tmp_path, coral_board):
    b = _pair_bundle(tmp_path / "lstm.coral", coral_board)
    with runtime.open(b, emulate=True) as r:
        assert isinstance(r, coral.Runner) and r.emulated
        _check_golden(r)
        d = r.describe()
        assert d["emulated"] is True and d["backend"] == "coral" and d["board"] == "coral-test"
        assert "this host's CPU" in d["note"] and "Edge TPU timing is not represented" in d["note"]
        assert d["interpreter"] == cpu.interpreter_path()


@pytest.mark.needs("edgetpu-pairs")
@no_libedgetpu
def test_device_path_without_library(tmp_path, coral_board):
    b = _pair_bundle(tmp_path / "lstm.coral", coral_board)
    with pytest.raises(BoardUnavailableError, match="Edge TPU runtime library .* is not installed") as exc:
        runtime.open(b, device="usb:0")
    assert "unrelated project" in exc.value.hint and "coral-edgetpu-stable" in exc.value.hint
    with pytest.raises(InputError, match="invalid Edge TPU device 'gpu'"):
        runtime.open(b, device="gpu")


@pytest.mark.needs("edgetpu-pairs")
def test_bundle_without_compiled_model(tmp_path, coral_board):
    b = _pair_bundle(tmp_path / "lstm.coral", coral_board, compiled=False)
    with pytest.raises(BoardUnavailableError, match="no Edge TPU compiled model: edgetpu_compiler was not on "
                                                    "PATH") as exc:                      # checked first
        runtime.open(b)
    assert exc.value.exit_code == 7
    assert "x86-64 Debian/Ubuntu" in exc.value.hint and "edgetpu-compiler" in exc.value.hint
    assert "--emulate" in exc.value.hint
    with runtime.open(b, emulate=True) as r:                                            # emulation needs none
        _check_golden(r)


@pytest.mark.needs("edgetpu-pairs")
def test_manifest_and_package_must_agree(tmp_path, coral_board):
    b = _pair_bundle(tmp_path / "lstm.coral", coral_board, accelerator={"min_runtime_version": 14})
    with pytest.raises(BundleError, match="manifest says min_runtime_version 14, but model_edgetpu.tflite's "
                                          "Edge TPU package says 13"):
        runtime.open(b)


@pytest.mark.needs("edgetpu-pairs")
def test_compiled_model_io_is_remapped():
    cpu_ir = TFLiteModel.from_file(PAIRS / "bodypix_mobilenet_v1_075_512_512_16_quant_decoder.tflite")
    tpu_ir = TFLiteModel.from_file(PAIRS / "bodypix_mobilenet_v1_075_512_512_16_quant_decoder_edgetpu.tflite")
    outs = [_spec(cpu_ir, i, f"o{k}") for k, i in enumerate(cpu_ir.main.outputs)]
    mapped = coral.Runner._remap(outs, tpu_ir.main.outputs, tpu_ir.main, "output")
    assert [s.index for s in outs] != [s.index for s in mapped] == list(tpu_ir.main.outputs)
    assert [s.name for s in mapped] == [s.name for s in outs]
    assert mapped[-1].scale == [float(tpu_ir.main.tensors[tpu_ir.main.outputs[-1]].quant.scale[0])]
    with pytest.raises(BundleError, match="compiled model has 7 output"):
        coral.Runner._remap(outs[:2], tpu_ir.main.outputs, tpu_ir.main, "output")


@pytest.mark.slow
def test_emulated_deeplob_is_bit_identical_to_cpu(deeplob_bundle, tmp_path, coral_board, deeplob_windows):
    dst = tmp_path / "deeplob.coral"
    shutil.copytree(deeplob_bundle, dst)
    raw = json.loads((dst / "manifest.json").read_text())
    raw.update(board=coral_board, backend="coral")
    (dst / "manifest.json").write_text(json.dumps(raw))
    load_bundle(dst)                                        # still verifies: manifest.json is not hashed
    with runtime.open(deeplob_bundle) as c, runtime.open(dst, emulate=True) as e:
        _check_golden(e)
        for x in deeplob_windows["x"][:64]:
            assert np.array_equal(c.predict_raw(x), e.predict_raw(x))
        assert e.describe()["emulated"] and e.describe()["interpreter"] == c.describe()["interpreter"]
    with pytest.raises(BoardUnavailableError, match="no Edge TPU compiled model"):
        runtime.open(dst)
