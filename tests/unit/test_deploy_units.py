"""Deploy pieces that need no box: target parsing and the ssh command line, the box probe on directory
trees laid out as the vendors' images lay them out, the board identity rules, the inventory formats."""
from __future__ import annotations

import shlex

import pytest

from edgehft.boards import load_board
from edgehft.deploy.inventory import read_inventory
from edgehft.deploy.probe import board_mismatches, parse_l4t, probe_box
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
    assert here["packages"]["edgehft"] and here["bundle_format_version"] == 2


def test_board_identity_rules():
    litert = {"packages": {"edgehft": "0.2.0", "ai-edge-litert": "2.3.0"}, "bundle_format_version": 1,
              "edgetpu": {"usb": 0, "pci": 0}}
    assert board_mismatches(load_board("cpu"), litert) == []
    assert "no LiteRT interpreter" in board_mismatches(load_board("cpu"), {**litert, "packages": {}})[0]
    assert board_mismatches(load_board("pynq-z2"), {**litert, "pynq_board": "Pynq-Z2"}) == []
    assert "PYNQ board is ZCU104, pynq-z2 needs Pynq-Z2" in board_mismatches(
        load_board("pynq-z2"), {**litert, "pynq_board": "ZCU104"})[0]
    orin = {**litert, "l4t": "36.4.0", "device_tree_model": "NVIDIA Jetson AGX Orin Developer Kit"}
    assert board_mismatches(load_board("jetson-agx-orin"), orin) == []
    why = board_mismatches(load_board("jetson-orin-nano"), orin)
    assert why == ["module is 'NVIDIA Jetson AGX Orin Developer Kit', not a Jetson orin nano"]
    assert "L4T 35.4.1" in board_mismatches(load_board("jetson-agx-orin"), {**orin, "l4t": "35.4.1"})[0]
    assert board_mismatches(load_board("coral-usb"), {**litert, "edgetpu": {"usb": 1, "pci": 0}}) == []
    assert "no Edge TPU on PCI" in board_mismatches(load_board("coral-pcie"), {**litert, "edgetpu": {"usb": 1, "pci": 0}})[0]
    assert "reads bundle format 0" in board_mismatches(load_board("cpu"), {**litert, "bundle_format_version": 0})[0]
    # a native-bf16 bundle is format 2: a box whose edgehft reads format 1 is refused, other bundles are not
    assert "this bundle is format 2" in board_mismatches(load_board("cpu"), litert, 2)[0]
    assert board_mismatches(load_board("cpu"), litert, 1) == []
    assert "no C++ compiler" in board_mismatches(load_board("cpu"), litert, needs_cxx=True)[0]
    assert board_mismatches(load_board("cpu"), {**litert, "cxx": "/usr/bin/g++"}, needs_cxx=True) == []
    no_amx = {**litert, "cxx": "/usr/bin/g++", "cpu_flags": ["avx512f"]}
    assert "no AMX-BF16" in board_mismatches(load_board("cpu"), no_amx, needs_cxx=True, needs_amx=True)[0]
    amx = {**no_amx, "cpu_flags": ["amx_bf16", "amx_tile", "avx512f"]}
    assert board_mismatches(load_board("cpu"), amx, needs_cxx=True, needs_amx=True) == []


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
