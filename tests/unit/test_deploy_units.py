"""Deploy pieces that need no box: target parsing and the ssh command line, the box probe on directory
trees laid out as the vendors' images lay them out, the board identity rules, the inventory formats."""
from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from edgehft.bundle import FORMAT_VERSION
from edgehft.boards import list_boards, load_board
from edgehft.deploy.inventory import read_inventory
from edgehft.deploy.probe import PACKAGES, board_mismatches, parse_l4t, probe_box, stack_mismatch
from edgehft.deploy.ssh import agent_argv, parse_target, ssh_argv
from edgehft.errors import InputError


def test_targets_and_the_ssh_command_line(tmp_path):
    t = parse_target("xilinx@10.0.0.7:2200", board=load_board("pynq-z2"), ssh_config=str(tmp_path / "none"))
    assert (t.user, t.host, t.port) == ("xilinx", "10.0.0.7", 2200)
    argv = ssh_argv(t, agent_argv(t, "receive", "--meta", '{"a": "b c"}'))
    opts = [argv[i + 1] for i, a in enumerate(argv) if a == "-o"]
    assert "StrictHostKeyChecking=yes" in opts and "BatchMode=yes" in opts
    assert argv[argv.index("-l") + 1] == "xilinx" and argv[argv.index("-p") + 1] == "2200"
    assert argv[-2] == "10.0.0.7"
    # one remote string, which the box's shell splits back into exactly these arguments
    assert shlex.split(argv[-1]) == ["env", "XILINX_XRT=/usr", "/usr/local/share/pynq-venv/bin/python3", "-m",
                                     "edgehft.deploy.agent", "receive", "--meta", '{"a": "b c"}', "--root",
                                     "/home/xilinx/edgehft"]
    v6 = parse_target("root@[fe80::1]:22")
    assert v6.host == "[fe80::1]" and ssh_argv(v6, ["true"])[-2] == "fe80::1"
    alias = parse_target("box")
    assert (alias.user, alias.port, alias.python) == (None, None, "python3")
    for bad in ("-oProxyCommand=x", "box;id", "a b", "u@@box", "box:99999", "box:abc", "$(id)", "`id`", ""):
        with pytest.raises(InputError):
            parse_target(bad)


def _tree(root, files: dict):
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def test_probe_reads_the_vendor_files(tmp_path):
    jetson = _tree(tmp_path / "jetson", {
        "etc/nv_tegra_release": "# R36 (release), REVISION: 4.0, GCID: 37537400, BOARD: generic, EABI: aarch64\n",
        "proc/device-tree/model": "NVIDIA Jetson AGX Orin Developer Kit\x00"})
    f = probe_box(jetson)
    assert (f["l4t"], f["device_tree_model"]) == ("36.4.0", "NVIDIA Jetson AGX Orin Developer Kit")
    assert parse_l4t("not a release file") is None
    coral = _tree(tmp_path / "coral", {"sys/bus/usb/devices/2-1/idVendor": "1a6e\n",
                                       "sys/bus/usb/devices/2-1/idProduct": "089a\n",
                                       "sys/bus/usb/devices/1-1/idVendor": "046d\n",
                                       "sys/bus/usb/devices/1-1/idProduct": "c52b\n",
                                       "dev/apex_0": ""})
    assert probe_box(coral)["edgetpu"] == {"usb": 1, "pci": 1}
    pynq = _tree(tmp_path / "pynq", {"etc/environment": 'PATH="/usr/bin"\nBOARD=Pynq-Z2\n'})
    assert probe_box(pynq)["pynq_board"] == "Pynq-Z2"
    here = probe_box()
    assert here["packages"]["edgehft"] and here["bundle_format_version"] == FORMAT_VERSION == 4


def test_board_identity_rules():
    litert = {"packages": {"edgehft": "0.2.0", "ai-edge-litert": "2.3.0"}, "bundle_format_version": 1,
              "edgetpu": {"usb": 0, "pci": 0}}
    assert board_mismatches(load_board("cpu"), litert) == []
    assert "no LiteRT interpreter" in board_mismatches(load_board("cpu"), {**litert, "packages": {}})[0]
    z2 = {**litert, "packages": {"edgehft": "0.2.0", "tflite-runtime": "2.14.0", "pynq": "3.1.2"}}
    assert board_mismatches(load_board("pynq-z2"), {**z2, "pynq_board": "Pynq-Z2"}) == []
    assert "PYNQ board is ZCU104, pynq-z2 needs Pynq-Z2" in board_mismatches(
        load_board("pynq-z2"), {**z2, "pynq_board": "ZCU104"})[0]
    orin = {**litert, "l4t": "36.4.0", "device_tree_model": "NVIDIA Jetson AGX Orin Developer Kit"}
    assert board_mismatches(load_board("jetson-agx-orin"), orin) == []
    why = board_mismatches(load_board("jetson-orin-nano"), orin)
    assert why == ["module is 'NVIDIA Jetson AGX Orin Developer Kit', not a Jetson orin nano"]
    assert "L4T 35.4.1" in board_mismatches(load_board("jetson-agx-orin"), {**orin, "l4t": "35.4.1"})[0]
    assert board_mismatches(load_board("coral-usb"), {**litert, "edgetpu": {"usb": 1, "pci": 0}}) == []
    assert "no Edge TPU on PCI" in board_mismatches(load_board("coral-pcie"), {**litert, "edgetpu": {"usb": 1, "pci": 0}})[0]
    assert "reads bundle format 0" in board_mismatches(load_board("cpu"), {**litert, "bundle_format_version": 0})[0]
    # a native-bf16 bundle of convs is format 2: a box whose edgehft reads format 1 is refused, other bundles are not
    assert "this bundle is format 2" in board_mismatches(load_board("cpu"), litert, 2)[0]
    assert board_mismatches(load_board("cpu"), litert, 1) == []



def test_board_stack_rules():
    """Every board file states its software stack; deploy's probe names each way a box differs from it, in one
    reason after the backend's own; an emulated box only hears it as a warning (tests/deploy)."""
    from edgehft.boards import BOARD_DIRS
    for board in list_boards():
        if Path(board.path).parent not in BOARD_DIRS:
            continue                                    # a plugin's board: [stack] is optional there
        st = board.stack
        assert st.image and st.arch and st.python, board.name
        assert set(st.packages) <= set(PACKAGES), board.name
    z2 = load_board("pynq-z2")
    real = {"arch": "armv7l", "python": "3.10.12", "pynq_board": "Pynq-Z2", "bundle_format_version": 4,
            "packages": {"edgehft": "0.3.0", "tflite-runtime": "2.14.0", "pynq": "3.1.2"}}
    assert stack_mismatch(z2, real) is None and board_mismatches(z2, real) == []
    x86 = {**real, "arch": "x86_64", "python": "3.11.7",
           "packages": {"edgehft": "0.3.0", "ai-edge-litert": "2.3.0", "pynq": "4.0.0"}}
    why = board_mismatches(z2, x86)
    assert len(why) == 1 and why[0].startswith("its software stack is not pynq-z2's (PYNQ 3.1 SD image")
    for part in ("arch x86_64, the image's is armv7l", "Python 3.11.7, the image's is ~=3.10.0",
                 "TFLite interpreter ai-edge-litert, the image takes tflite-runtime (pip install tflite-runtime)",
                 "pynq 4.0.0, the image has >=3.1,<3.2"):
        assert part in why[0]
    assert board_mismatches(z2, x86, stack=False) == []
    no_pynq = {**real, "packages": {"tflite-runtime": "2.14.0"}}
    assert stack_mismatch(z2, no_pynq).endswith("pynq not installed, the image has pynq >=3.1,<3.2")
    assert "Python 3.12.1, the image's is ~=3.10.0" in stack_mismatch(z2, {**real, "python": "3.12.1"})
    kv = load_board("kv260")
    assert "TFLite interpreter tflite-runtime, the image takes ai-edge-litert" in stack_mismatch(
        kv, {**real, "arch": "aarch64", "python": "3.12.3", "packages": {"tflite-runtime": "2.14.0", "pynq": "4.0.1"}})
    assert stack_mismatch(load_board("cpu"), {"arch": "x86_64", "python": "3.10.14",
                                              "packages": {"tflite-runtime": "2.14.0"}}) is None
    assert "arch riscv64" in stack_mismatch(load_board("cpu"), {"arch": "riscv64", "packages": {"ai-edge-litert": "2"}})
    assert stack_mismatch(load_board("cpu"), {"python": "3.13.0rc1", "packages": {"ai-edge-litert": "2"}}) is None
    # JetPack 5's Python 3.8 with tflite-runtime (no ai-edge-litert for cp38) is a cpu box; 3.7 is not
    assert stack_mismatch(load_board("cpu"), {"arch": "aarch64", "python": "3.8.10",
                                              "packages": {"tflite-runtime": "2.13.0"}}) is None
    assert "Python 3.7.17, the image's is >=3.8" in stack_mismatch(load_board("cpu"), {
        "python": "3.7.17", "packages": {"tflite-runtime": "2.13.0"}})
    odd = {**real, "packages": {**real["packages"], "pynq": "?"}}
    assert stack_mismatch(z2, odd).endswith("pynq '?' (not a version edgehft can read), the image has >=3.1,<3.2")


def test_a_bad_stack_in_a_board_file_is_an_input_error(tmp_path, monkeypatch):
    from edgehft import boards
    text = (Path(boards.BOARD_DIRS[1]) / "cpu.toml").read_text().replace('name = "cpu"', 'name = "mine"')
    (tmp_path / "mine.toml").write_text(text.replace('python = ">=3.8"', 'python = "three eight"'))
    monkeypatch.setattr(boards, "BOARD_DIRS", (tmp_path,))
    with pytest.raises(InputError, match="(?s)mine.toml is invalid.*stack.python.*not a PEP 440 version specifier: 'three eight'"):
        boards.load_board("mine")


def test_native_kernel_rules():
    """A native bundle needs a kernel library that loads on the box, or g++ and Highway's headers to build
    one; native-bf16-only bundles need AMX-BF16 or AVX512_BF16 the kernels can use. Boxes whose edgehft
    predates the native_kernels fact build at first open, so they need g++."""
    cpu = load_board("cpu")
    litert = {"packages": {"edgehft": "0.3.0", "ai-edge-litert": "2.3.0"}, "bundle_format_version": 2}
    none = {"prebuilt": None, "cached": None, "targets": None, "error": None, "compiler": None, "highway": None}
    prebuilt = {**none, "prebuilt": "/opt/venv/edgehft/kernels/cpu/prebuilt/libedgehft_cpu.so",
                "targets": ["avx3", "avx2", "scalar"]}
    # prebuilt present, no g++: accepted
    assert board_mismatches(cpu, {**litert, "cxx": None, "native_kernels": prebuilt}, needs_kernels=True) == []
    assert board_mismatches(cpu, {**litert, "native_kernels": prebuilt}, needs_cxx=True) == []   # the older name
    why = board_mismatches(cpu, {**litert, "native_kernels": none}, needs_kernels=True)
    assert len(why) == 1 and "no prebuilt kernel library matching its sources" in why[0]
    assert "no C++ compiler (g++)" in why[0] and "platform wheel" in why[0] and "libhwy-dev" in why[0]
    assert board_mismatches(cpu, {**litert, "native_kernels": none}) == []            # not a native bundle
    no_hwy = {**none, "compiler": "/usr/bin/g++", "highway": False}
    assert "Highway's headers missing (the compiler /usr/bin/g++" in board_mismatches(
        cpu, {**litert, "native_kernels": no_hwy}, needs_kernels=True)[0]
    builds = {**no_hwy, "highway": True}
    assert board_mismatches(cpu, {**litert, "native_kernels": builds}, needs_kernels=True) == []
    broken = {**prebuilt, "targets": None, "error": "cannot load libedgehft_cpu.so: GLIBC_2.38 not found"}
    assert "does not load (cannot load libedgehft_cpu.so: GLIBC_2.38" in board_mismatches(
        cpu, {**litert, "native_kernels": broken}, needs_kernels=True)[0]
    # an older box: no native_kernels fact, it builds at first open
    old = {**litert, "packages": {**litert["packages"], "edgehft": "0.2.0"}}
    assert "no C++ compiler (g++) on the box" in board_mismatches(cpu, old, needs_kernels=True)[0]
    assert "edgehft 0.2.0 builds them" in board_mismatches(cpu, old, needs_kernels=True)[0]
    assert board_mismatches(cpu, {**old, "cxx": "/usr/bin/g++"}, needs_kernels=True) == []
    # native-bf16-only bundles: refused without bf16 products in hardware (AMX-BF16 or AVX512_BF16), with the
    # reason, whatever else the box has
    no_bf16 = {**litert, "native_kernels": prebuilt, "cpu_flags": ["avx2", "avx512f"]}
    why = board_mismatches(cpu, no_bf16, needs_kernels=True, needs_bf16=True)
    assert len(why) == 1 and "neither AMX-BF16 nor AVX512_BF16 (cpu flags: avx2, avx512f)" in why[0]
    amx = {**no_bf16, "cpu_flags": ["amx_bf16", "amx_tile", "avx512f"]}
    assert "run no bf16 products in hardware there (they run: avx3, avx2, scalar" in board_mismatches(
        cpu, amx, needs_kernels=True, needs_bf16=True)[0]
    amx["native_kernels"] = {**prebuilt, "targets": ["amx", "avx3_bf16", "avx3", "avx2", "scalar"]}
    assert board_mismatches(cpu, amx, needs_kernels=True, needs_bf16=True) == []
    zen4 = {**no_bf16, "cpu_flags": ["avx2", "avx512_bf16", "avx512f"],
            "native_kernels": {**prebuilt, "targets": ["avx3_bf16", "avx3", "avx2", "scalar"]}}
    assert board_mismatches(cpu, zen4, needs_kernels=True, needs_bf16=True) == []
    # an older probe reports fewer CPU flags: the kernels' own targets decide where they are reported
    assert board_mismatches(cpu, {**zen4, "cpu_flags": ["avx512f"]}, needs_kernels=True, needs_bf16=True) == []
    assert "neither AMX-BF16 nor AVX512_BF16" in board_mismatches(cpu, {**old, "cxx": "/usr/bin/g++", "cpu_flags": []},
                                                                  needs_kernels=True, needs_bf16=True)[0]


def test_probe_reports_the_native_kernels_here(tmp_path, monkeypatch):
    """probe_box's native_kernels fact on this machine: the library that loads and its targets, the
    compiler; none of it for a directory tree (another machine's files)."""
    from edgehft.kernels.cpu import build
    facts = probe_box()["native_kernels"]
    assert facts["targets"] == build.targets() and facts["error"] is None
    assert facts["prebuilt"] == (str(build.prebuilt_library()) if build.prebuilt_library() else None)
    assert probe_box(tmp_path)["native_kernels"] is None
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-g++"))
    monkeypatch.setattr(build, "prebuilt_library", lambda *a: None)
    monkeypatch.setenv("EDGEHFT_CACHE", str(tmp_path / "empty-cache"))
    assert probe_box()["native_kernels"] == {"prebuilt": None, "cached": None, "targets": None, "error": None,
                                             "compiler": None, "highway": None}


def test_inventory_formats(tmp_path):
    toml = tmp_path / "hosts.toml"
    toml.write_text('[[hosts]]\nhost = "xilinx@10.0.0.7"\nboard = "pynq-z2"\n[[hosts]]\nhost = "box2"\n')
    assert read_inventory(toml) == [{"host": "xilinx@10.0.0.7", "board": "pynq-z2"}, {"host": "box2"}]
    text = tmp_path / "hosts.txt"
    text.write_text("# rack 4\nedgehft@10.0.0.5:2222 install_dir=/srv/edgehft\n\nbox3  # spare\n")
    assert read_inventory(text) == [{"host": "edgehft@10.0.0.5:2222", "install_dir": "/srv/edgehft"}, {"host": "box3"}]
    for content, suffix, message in (("box1 colour=red\n", ".txt", "bad entry"), ("box1 nokeyvalue\n", ".txt", "not key=value"),
                                     ("# nothing\n", ".txt", "lists no hosts"), ("[[hosts]]\nboard='cpu'\n", ".toml", "bad entry"),
                                     ("[[hosts\n", ".toml", "not valid TOML")):
        p = tmp_path / f"bad{suffix}"
        p.write_text(content)
        with pytest.raises(InputError, match=message):
            read_inventory(p)


ANSIBLE_INI = """\
[ny4]
box1 ansible_host=10.0.0.7 ansible_port=2222 ansible_user=xilinx edgehft_board=pynq-z2
box2 ansible_host=fe80::7

[ld4]
box3 edgehft_install_dir=/srv/edgehft

[ny4:vars]
edgehft_python=/usr/local/share/pynq-venv/bin/python

[fleet:children]
ny4
ld4
"""

ANSIBLE_YAML = """\
all:
  children:
    fleet:
      vars:
        edgehft_board: kv260
      children:
        ny4:
          hosts:
            box1: {ansible_host: 10.0.0.7, ansible_user: ubuntu}
        canary:
          hosts:
            box9: {edgehft_board: zcu104}
"""


def test_ansible_inventories_through_ansible_core(tmp_path):
    pytest.importorskip("ansible", reason="ansible-core: pip install 'edgehft[fleet]'")
    ini = tmp_path / "hosts"                          # no suffix: the [group] lines say it is Ansible's INI
    ini.write_text(ANSIBLE_INI)
    py = "/usr/local/share/pynq-venv/bin/python"
    assert read_inventory(ini) == [
        {"host": "xilinx@10.0.0.7:2222", "name": "box1", "groups": ["fleet", "ny4"], "board": "pynq-z2", "python": py},
        {"host": "[fe80::7]", "name": "box2", "groups": ["fleet", "ny4"], "python": py},
        {"host": "box3", "name": "box3", "groups": ["fleet", "ld4"], "install_dir": "/srv/edgehft"}]
    assert [e["name"] for e in read_inventory(ini, "ld4")] == ["box3"]
    assert [e["name"] for e in read_inventory(ini, "fleet:!ny4")] == ["box3"]
    assert [e["name"] for e in read_inventory(ini, "box2:box3")] == ["box2", "box3"]
    for e in read_inventory(ini):                    # every entry is a target deploy can parse
        assert parse_target(e["host"]).host in ("10.0.0.7", "[fe80::7]", "box3")
    with pytest.raises(InputError, match="no hosts that --limit 'ld5' matches") as exc:
        read_inventory(ini, "ld5")
    assert "fleet, ld4, ny4" in exc.value.hint
    yml = tmp_path / "fleet.yml"
    yml.write_text(ANSIBLE_YAML)
    assert read_inventory(yml) == [
        {"host": "ubuntu@10.0.0.7", "name": "box1", "groups": ["fleet", "ny4"], "board": "kv260"},
        {"host": "box9", "name": "box9", "groups": ["canary", "fleet"], "board": "zcu104"}]   # host var wins
    canary = tmp_path / "RENDERED"
    templated = tmp_path / "templated.ini"           # variables are taken as written: no Jinja2, no lookups run
    templated.write_text(f"[g]\nb1 edgehft_board=\"{{{{ lookup('pipe', 'touch {canary}') }}}}\"\n")
    assert read_inventory(templated)[0]["board"] == f"{{{{ lookup('pipe', 'touch {canary}') }}}}"
    assert not canary.exists()
    bad = tmp_path / "bad.yml"
    bad.write_text("all: [unclosed\n")
    with pytest.raises(InputError, match="cannot be read|lists no hosts"):
        read_inventory(bad)


def test_limit_on_edgehft_inventories(tmp_path):
    toml = tmp_path / "hosts.toml"
    toml.write_text('[[hosts]]\nhost = "xilinx@10.0.0.7:22"\n[[hosts]]\nhost = "box2"\n')
    assert read_inventory(toml, "xilinx@10.0.0.7:22") == [{"host": "xilinx@10.0.0.7:22"}]
    assert read_inventory(toml, "box2, xilinx@10.0.0.7:22") == read_inventory(toml)
    with pytest.raises(InputError, match="matches no host") as exc:
        read_inventory(toml, "ny4")
    assert "Ansible inventory" in exc.value.hint


def test_reading_an_inventory_runs_no_ansible_plugin_or_script(tmp_path):
    """An executable inventory is never run, even with the caller's ANSIBLE_INVENTORY_ENABLED naming the script
    plugin, and an ansible.cfg in the working directory (vars_plugins) is not read: edgehft forces its own settings
    (a fresh process: Ansible reads them when first imported)."""
    import subprocess
    import sys
    pytest.importorskip("ansible", reason="ansible-core: pip install 'edgehft[fleet]'")
    (tmp_path / "vp").mkdir()
    (tmp_path / "vp" / "evil.py").write_text(f"open({str(tmp_path / 'PWNED_vars')!r}, 'w').close()\n"
                                             "from ansible.plugins.vars import BaseVarsPlugin\n"
                                             "class VarsModule(BaseVarsPlugin):\n"
                                             "    def get_vars(self, loader, path, entities, cache=True):\n"
                                             "        return {}\n")
    (tmp_path / "ansible.cfg").write_text("[defaults]\nvars_plugins = ./vp\nvars_plugins_enabled = evil,host_group_vars\n")
    script = tmp_path / "exec.ini"
    script.write_text(f"#!/bin/sh\ntouch {tmp_path / 'PWNED_script'}\necho '{{\"all\": {{\"hosts\": [\"b1\"]}}}}'\n")
    script.chmod(0o755)
    (tmp_path / "plain.ini").write_text("[g]\nb1\n")
    code = ("import sys\nfrom edgehft.deploy.inventory import read_inventory\nfrom edgehft.errors import InputError\n"
            "print([e['name'] for e in read_inventory('plain.ini')])\n"
            "try:\n    read_inventory('exec.ini')\nexcept InputError as e:\n    print('refused', e.exit_code)\n")
    env = {**__import__("os").environ, "ANSIBLE_INVENTORY_ENABLED": "script,ini,yaml"}
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split("\n")[:2] == ["['b1']", "refused 3"], res.stdout + res.stderr
    assert not (tmp_path / "PWNED_script").exists() and not (tmp_path / "PWNED_vars").exists()


def test_an_inventory_or_a_state_that_is_no_small_regular_file_is_refused(tmp_path):
    """A FIFO is refused without being read (no hang), an oversized file is refused unread past the limit."""
    import os
    from edgehft.deploy import rollout
    fifo = tmp_path / "fifo.ini"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="is not a regular file"):
        read_inventory(fifo)
    with pytest.raises(InputError, match="is not a regular file"):
        rollout.load(fifo)
    big = tmp_path / "big.ini"
    big.write_bytes(b"#" * (5 << 20))
    with pytest.raises(InputError, match="more than 4,194,304 B"):
        read_inventory(big)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(InputError, match="nested too deeply"):
        rollout.load(deep)
