"""The deploy tests' shared fixtures and helpers (tests/deploy/): the bundles they deploy (re-signed copies of
the session's DeepLOB cpu bundle), a box (the loopback sshd of conftest's ``ssh_box`` with a client config and
an empty install dir per test), the CLI and ``deploy`` targets aimed at it, and a 4 MiB tmpfs for disk-full
faults. Import the fixtures by name in a test module (``from deploy_box import bundles, box``)."""
from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from edgehft.bundle import MANIFEST, load_bundle, sha256_file
from edgehft.cli import main
from edgehft.deploy.ssh import parse_target


def resign(src: Path, dst: Path, mutate=None, tag: str = "") -> Path:
    """Copy bundle ``src`` to ``dst``, let ``mutate(dst)`` change files, then re-hash the manifest (so the
    copy verifies) with ``tag`` in its creation time (so each copy is a distinct version)."""
    shutil.copytree(src, dst)
    if mutate:
        mutate(dst)
    m = json.loads((dst / MANIFEST).read_text())
    m["files"] = {rel: sha256_file(dst / rel) for rel in m["files"]}
    m["created_utc"] = m["created_utc"] + tag
    (dst / MANIFEST).write_text(json.dumps(m, indent=1))
    load_bundle(dst, verify=True)
    return dst


@pytest.fixture(scope="module")
def bundles(deeplob_bundle, tmp_path_factory):
    work = tmp_path_factory.mktemp("deploy-bundles")

    def bad_golden(d: Path):
        with np.load(d / "golden.npz") as z:
            arrays = {k: z[k].copy() for k in z.files}
        key = next(k for k in arrays if k.startswith("outputs/"))
        arrays[key][3] = arrays[key][3] + 1         # window 3's first output off by one LSB
        np.savez(d / "golden.npz", **arrays)

    return {"v1": resign(deeplob_bundle, work / "v1", tag="v1"),
            "v2": resign(deeplob_bundle, work / "v2", tag="v2"),
            "bad_golden": resign(deeplob_bundle, work / "bad", bad_golden, tag="bad")}


@pytest.fixture
def box(ssh_box, tmp_path):
    """(sshd, client config, an empty install dir for this test)."""
    return ssh_box, ssh_box.config(f"ssh_config_{tmp_path.name}"), tmp_path / "install"


def target(box, config=None, install=None):
    sshd, cfg, root = box
    return parse_target("box", python=sshd.python, install_dir=str(install or root), ssh_config=str(config or cfg))


def cli(box, *args, config=None):
    sshd, cfg, root = box
    return CliRunner().invoke(main, [*args, "--ssh-config", str(config or cfg), "--remote-python", sshd.python,
                                     "--install-dir", str(root)])


def deployed(box, bundle) -> dict:
    res = cli(box, "deploy", str(bundle), "--host", "box", "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.output)["results"][0]


@pytest.fixture
def tiny_disk(tmp_path):
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a small tmpfs here ({r.stderr.strip()}); disk-full needs root")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def wait_no_partial(root: Path, timeout: float = 15.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p.name for p in (root / "incoming").iterdir()] if (root / "incoming").is_dir() else []
        if not left:
            return left
        time.sleep(0.2)
    return left
