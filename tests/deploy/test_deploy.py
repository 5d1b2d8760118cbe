"""``edgehft deploy``/``status``/``rollback`` against a real sshd on 127.0.0.1 (tests/sshbox.py), with the
box's edgehft in the board venv, and the fault matrix: each fault leaves the previous version serving with
its files unchanged."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgehft import runtime
from edgehft.bundle import MANIFEST, load_bundle, sha256_file
from edgehft.bundle_checks import check_golden
from edgehft.cli import main
from edgehft.deploy.deploy import deploy
from deploy_box import bundles, box, cli, deployed, resign, target, tiny_disk, wait_no_partial  # noqa: F401 (fixtures)


def snapshot(root: Path) -> dict:
    """Where current points, and every file of that version with its SHA-256."""
    active = root / os.readlink(root / "current")
    return {"current": os.readlink(root / "current"),
            "files": {str(p.relative_to(active)): sha256_file(p) for p in sorted(active.rglob("*")) if p.is_file()}}


def serves(root: Path) -> dict:
    """Open the active bundle as a serving process would and run its golden vectors."""
    with runtime.open(root / "current") as r:
        return check_golden(r)


def test_deploy_status_rollback(box, bundles):
    _, _, root = box
    first = deployed(box, bundles["v1"])
    assert first["golden"]["count"] == first["golden"]["matched"] == 16 and first["golden"]["compare"] == "exact"
    assert first["golden"]["path"].startswith("ai-edge-litert 2.3.0")         # ran in the box's venv
    assert set(first["seconds"]) == {"probe", "hold", "upload", "verify", "golden", "latency", "switch"}
    assert not (root / "previous").exists() and first["warnings"] == []
    second = deployed(box, bundles["v2"])
    assert second["active_before"] == first["active_after"] and second["active_after"] != first["active_after"]
    assert os.readlink(root / "current") == f"versions/{second['version']}"
    assert os.readlink(root / "previous") == f"versions/{first['version']}"
    assert serves(root)["ok"]
    st = json.loads(cli(box, "status", "--host", "box", "--json").output)["status"]
    assert st["active"] == second["version"] and st["previous"] == first["version"]
    assert st["previous_source"] == "link" and st["held_by"] is None
    assert st["active_info"]["bundle_sha256"] == sha256_file(bundles["v2"] / MANIFEST)
    assert st["active_info"]["model_sha256"] == load_bundle(bundles["v2"]).manifest.files["model.tflite"]
    human = cli(box, "status", "--host", "box")
    assert human.exit_code == 0 and "previous" in human.output and "ai-edge-litert 2.3.0" in human.output
    rb = cli(box, "rollback", "--host", "box", "--json")
    assert rb.exit_code == 0 and json.loads(rb.output) == {"active": first["version"], "previous": second["version"],
                                                           "warnings": []}
    assert os.readlink(root / "current") == f"versions/{first['version']}" and serves(root)["ok"]
    assert os.readlink(root / "previous") == f"versions/{second['version']}"          # rollback swaps them


def test_keep_prunes_old_versions_but_never_active_or_previous(box, bundles):
    _, _, root = box
    vids = [deployed(box, bundles[k])["version"] for k in ("v1", "v2", "v1", "v2")]
    res = cli(box, "deploy", str(bundles["v1"]), "--host", "box", "--keep", "2", "--json")
    newest = json.loads(res.output)["results"][0]["version"]
    assert sorted(p.name for p in (root / "versions").iterdir()) == sorted([vids[-1], newest])


@pytest.fixture
def serving_v1(box, bundles):
    """A box serving v1; returns its snapshot."""
    deployed(box, bundles["v1"])
    return snapshot(box[2])


def assert_unchanged(root: Path, before: dict) -> None:
    assert snapshot(root) == before
    assert serves(root)["ok"]


def test_connection_dropped_mid_transfer(box, bundles, serving_v1):
    sshd, _, root = box
    dropping = sshd.config("ssh_drop", drop_after=60_000)     # the handshake fits; the 265 kB bundle does not
    res = deploy(target(box, dropping), bundles["v2"])
    assert not res.ok and res.step == "upload" and res.exit_code in (9, 10), res
    assert wait_no_partial(root) == []                          # the agent removed its half transfer
    assert_unchanged(root, serving_v1)


def test_corrupted_file_on_box_is_caught_before_the_switch(box, bundles, serving_v1):
    _, _, root = box

    def flip_a_byte(step, tgt, ctx):
        if step == "verify":
            p = root / "incoming" / ctx["version"] / "model.tflite"
            data = bytearray(p.read_bytes())
            data[len(data) // 2] ^= 0x01
            p.write_bytes(bytes(data))

    res = deploy(target(box), bundles["v2"], on_step=flip_a_byte)
    assert (res.ok, res.step, res.exit_code) == (False, "verify", 9)
    assert "model.tflite changed" in res.error
    assert not (root / "incoming" / res.version).exists()        # discarded
    assert_unchanged(root, serving_v1)
    assert any(h["event"] == "failed" and h["version"] == res.version for h in
               json.loads(cli(box, "status", "--host", "box", "--json").output)["status"]["history"])


def test_golden_mismatch_on_box_switches_nothing(box, bundles, serving_v1):
    _, _, root = box
    res = cli(box, "deploy", str(bundles["bad_golden"]), "--host", "box")
    assert res.exit_code == 8, res.output
    assert "golden vectors differ on the box: 1 of 16" in res.output
    assert_unchanged(root, serving_v1)
    assert wait_no_partial(root) == []


@pytest.mark.parametrize("point", ["receive:before-rename", "activate:before-move", "activate:before-switch",
                                   "activate:between-links"])
def test_agent_killed_before_the_switch(box, bundles, serving_v1, point):
    sshd, _, root = box
    res = deploy(target(box, sshd.config(f"ssh_kill_{point}", failpoints=point)), bundles["v2"])
    assert not res.ok and res.exit_code == 9 and "without a result" in res.error
    assert_unchanged(root, serving_v1)
    if point == "activate:between-links":       # previous == current: not known from the links, so the history
        st = json.loads(cli(box, "status", "--host", "box", "--json").output)["status"]
        assert os.readlink(root / "previous") == serving_v1["current"]
        assert (st["previous"], st["previous_source"]) == (None, "history")     # v1 was the first version
    again = deployed(box, bundles["v2"])                         # the next deploy cleans up and succeeds
    assert not list(root.glob(".current.*")) and not list(root.glob(".previous.*"))
    assert not list((root / "incoming").glob("*.partial"))
    assert os.readlink(root / "current") == f"versions/{again['version']}"
    assert os.readlink(root / "previous") == serving_v1["current"]
    # the deploy removes what its killed step staged; a version moved into versions/ is never switched to
    st = json.loads(cli(box, "status", "--host", "box", "--json").output)["status"]
    assert st["staged"] == [] and st["partial"] == [] and st["previous"] == Path(serving_v1["current"]).name
    if point in ("activate:before-switch", "activate:between-links"):
        assert {v["version"]: v["active"] for v in st["versions"]}[res.version] is False


def test_agent_killed_right_after_the_switch(box, bundles, serving_v1):
    sshd, _, root = box
    res = deploy(target(box, sshd.config("ssh_kill_after", failpoints="activate:after-switch")), bundles["v2"])
    assert not res.ok and res.step == "switch"
    # the switch is one rename: the box runs the new, complete, verified version
    assert os.readlink(root / "current") == f"versions/{res.version}" and serves(root)["ok"]
    assert sha256_file(root / "current" / MANIFEST) == sha256_file(bundles["v2"] / MANIFEST)


def test_disk_full(box, bundles, tiny_disk):
    sshd, cfg, _ = box
    root = tiny_disk / "install"
    tgt = target(box, install=root)
    assert deploy(tgt, bundles["v1"]).ok
    before = snapshot(root)
    st = os.statvfs(tiny_disk)
    (tiny_disk / "ballast").write_bytes(b"\0" * (st.f_bavail * st.f_frsize - (1 << 20)))  # logs filled the disk
    res = deploy(tgt, bundles["v2"])
    assert (res.ok, res.step, res.exit_code) == (False, "upload", 9) and "disk full" in res.error
    assert_unchanged(root, before)
    assert wait_no_partial(root) == []


def test_disk_fills_during_the_transfer(tiny_disk, deeplob_bundle):
    """ENOSPC from the kernel in the middle of unpacking: the partial directory goes, nothing else changes."""
    import io
    import tarfile
    from edgehft.deploy.store import Store
    from edgehft.errors import DeployError
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for rel in [*load_bundle(deeplob_bundle).manifest.files, MANIFEST]:
            tar.add(deeplob_bundle / rel, arcname=rel)

    class FillsDisk(io.BytesIO):
        """Reads like the SSH stream, while another writer on the box takes the free space."""
        filled = False

        def read(self, n=-1):
            if not self.filled:
                FillsDisk.filled = True
                with open(tiny_disk / "ballast", "wb") as fh:
                    try:
                        while True:
                            fh.write(b"\0" * 65536)
                    except OSError:
                        pass
            return super().read(n)

    store = Store(tiny_disk / "install")
    with pytest.raises(DeployError, match="disk full on the box while receiving"):
        store.receive("20261130T000000Z-0123456789ab-cdef", FillsDisk(buf.getvalue()), len(buf.getvalue()), {})
    assert list((tiny_disk / "install" / "incoming").iterdir()) == []


def test_unknown_and_changed_host_keys_are_refused(box, bundles, tmp_path):
    sshd, _, root = box
    empty = tmp_path / "known_hosts_empty"
    empty.write_text("")
    res = cli(box, "deploy", str(bundles["v1"]), "--host", "box", config=sshd.config("ssh_unknown", known_hosts=empty))
    assert res.exit_code == 10 and "host key unknown" in res.output and "ssh-keyscan" in res.output
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    wrong = tmp_path / "known_hosts_wrong"
    wrong.write_text(f"[127.0.0.1]:{sshd.port} " + " ".join((other.with_suffix(".pub")).read_text().split()[:2]) + "\n")
    res = cli(box, "deploy", str(bundles["v1"]), "--host", "box", config=sshd.config("ssh_changed", known_hosts=wrong))
    assert res.exit_code == 10 and "host key changed" in res.output
    assert not root.exists()                                    # nothing reached the box
    assert wrong.read_text().count("\n") == 1                   # and known_hosts was not edited


def test_board_checks_and_force(box, bundles, tmp_path):
    _, _, root = box
    res = cli(box, "deploy", str(bundles["v1"]), "--host", "box", "--board", "pynq-z2")
    assert res.exit_code == 9 and "compiled for cpu, not pynq-z2" in res.output
    assert "the box serves: unknown (the box was not reached" in res.output
    as_pynq = resign(bundles["v1"], tmp_path / "as-pynq", lambda d: None, tag="pynq")
    m = json.loads((as_pynq / MANIFEST).read_text())
    m["board"] = "pynq-z2"
    (as_pynq / MANIFEST).write_text(json.dumps(m))
    res = cli(box, "deploy", str(as_pynq), "--host", "box")
    assert res.exit_code == 9 and "the box is not a pynq-z2: PYNQ board is not set" in res.output
    res = cli(box, "deploy", str(as_pynq), "--host", "box", "--force")
    assert "--force" in res.output and "FORCED" in res.output and res.exit_code == 9
    assert "failed at golden" in res.output                      # forced through the probe, stopped by golden
    assert not (root / "current").exists()
    # emulated: the box's software stack is a warning, not a forced check (the cpu bundle then refuses --emulate)
    res = cli(box, "deploy", str(bundles["v1"]), "--host", "box", "--board", "pynq-z2", "--force", "--emulate")
    assert res.output.count("FORCED") == 2 and "warning: box: emulated: its software stack is not pynq-z2's" in res.output
    assert res.exit_code == 9 and "--emulate/--device apply to accelerator" in res.output
    res = cli(box, "deploy", str(bundles["v1"]), "--host", "box", "--board", "pynq-z2", "--force")
    assert res.exit_code == 0 and res.output.count("FORCED") == 3   # golden ran as the bundle's own board
    assert "its software stack is not pynq-z2's" in res.output and "arch x86_64, the image's is armv7l" in res.output
    assert (root / "current" / MANIFEST).is_file()


def test_dry_run_changes_nothing(box, bundles, serving_v1):
    _, _, root = box
    res = cli(box, "deploy", str(bundles["v2"]), "--host", "box", "--dry-run")
    assert res.exit_code == 0 and "would upload 5 files" in res.output and "would switch" in res.output
    assert_unchanged(root, serving_v1)
    assert not (root / "incoming").exists() or not list((root / "incoming").iterdir())


def test_inventory_parallel_with_one_bad_host(box, bundles, tmp_path):
    sshd, cfg, _ = box
    inv = tmp_path / "hosts.toml"
    inv.write_text(f"""
[[hosts]]
host = "box"
install_dir = "{tmp_path}/a"
[[hosts]]
host = "box"
install_dir = "{tmp_path}/b"
[[hosts]]
host = "nobody@127.0.0.1:1"
""")
    res = CliRunner().invoke(main, ["deploy", str(bundles["v1"]), "--hosts", str(inv), "--ssh-config", str(cfg),
                                    "--remote-python", sshd.python, "--json", "--engine", "threads"])
    assert res.exit_code == 9
    rows = json.loads(res.output)["results"]
    assert [r["ok"] for r in rows] == [True, True, False] and rows[2]["exit_code"] == 10
    assert (tmp_path / "a" / "current").exists() and (tmp_path / "b" / "current").exists()
    table = CliRunner().invoke(main, ["deploy", str(bundles["v2"]), "--hosts", str(inv), "--ssh-config", str(cfg),
                                      "--remote-python", sshd.python, "--engine", "threads"])
    assert table.exit_code == 9 and "failed at probe" in table.output and table.output.count("│ ok") == 2


def test_ansible_inventory_with_limit(box, bundles, tmp_path):
    # issue 18: the Ansible inventory ops teams keep (groups, children, group vars; read by ansible-core) and
    # --limit as Ansible takes it; the boxes outside the limit are not touched.
    pytest.importorskip("ansible", reason="ansible-core: pip install 'edgehft[fleet]'")
    sshd, cfg, _ = box
    inv = tmp_path / "fleet.ini"
    inv.write_text(f"""\
[ny4]
a1 ansible_host=box edgehft_install_dir={tmp_path}/a1
a2 ansible_host=box edgehft_install_dir={tmp_path}/a2
[ld4]
b1 ansible_host=box edgehft_install_dir={tmp_path}/b1
[fleet:children]
ny4
ld4
[fleet:vars]
edgehft_python={sshd.python}
""")
    res = CliRunner().invoke(main, ["deploy", str(bundles["v1"]), "--hosts", str(inv), "--limit", "fleet:!ld4",
                                    "--ssh-config", str(cfg), "--json", "--no-latency-gate"])   # Ansible runs it
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)["results"]
    assert [r["install_dir"] for r in rows] == [f"{tmp_path}/a1", f"{tmp_path}/a2"] and all(r["ok"] for r in rows)
    assert (tmp_path / "a1" / "current").exists() and not (tmp_path / "b1").exists()
    nothing = CliRunner().invoke(main, ["deploy", str(bundles["v1"]), "--hosts", str(inv), "--limit", "ld5",
                                        "--ssh-config", str(cfg)])
    assert nothing.exit_code == 3 and "--limit 'ld5'" in nothing.output and "fleet, ld4, ny4" in nothing.output
    alone = CliRunner().invoke(main, ["deploy", str(bundles["v1"]), "--host", "box", "--limit", "ny4"])
    assert alone.exit_code == 2 and "--limit selects hosts of --hosts FILE" in alone.output
    # the fleet table: what each box serves, and whether it is the bundle the rollout asked for
    st = CliRunner().invoke(main, ["status", "--hosts", str(inv), "--bundle", str(bundles["v1"]),
                                   "--ssh-config", str(cfg), "--json"])
    assert st.exit_code == 9, st.output                                 # b1 serves nothing
    boxes = {b["name"]: b for b in json.loads(st.output)["boxes"]}
    assert [boxes[n]["matches"] for n in ("a1", "a2", "b1")] == [True, True, False]
    assert boxes["a1"]["active"] == rows[0]["version"] and boxes["a1"]["last_switch"]["event"] == "activate"
    assert boxes["a1"]["model_sha256"] == load_bundle(bundles["v1"]).manifest.files["model.tflite"]
    assert boxes["b1"]["reached"] and boxes["b1"]["active"] is None
    env = {"COLUMNS": "80"}
    table = CliRunner().invoke(main, ["status", "--hosts", str(inv), "--limit", "ny4", "--bundle", str(bundles["v1"]),
                                      "--ssh-config", str(cfg)], env=env)
    assert table.exit_code == 0, table.output
    lines = table.output.splitlines()
    assert all(len(ln) <= 80 for ln in lines) and sum(rows[0]["version"] in ln for ln in lines) == 1
    assert "2 of 2 boxes answered" in table.output and "board on every box that answered: cpu" in table.output
    inv.write_text(inv.read_text() + "[spare]\nz9 ansible_host=127.0.0.1 ansible_port=1\n")
    gone = CliRunner().invoke(main, ["status", "--hosts", str(inv), "--limit", "spare", "--ssh-config", str(cfg)])
    assert gone.exit_code == 10 and "not reached" in gone.output


def test_a_deploy_is_one_ssh_connection_to_the_box(box, bundles):
    # issue 18: one SSH connection per box for a whole deploy (an OpenSSH ControlMaster of the deploy's own),
    # counted in the box's sshd log; with share_connection=False each step connects on its own, as before.
    sshd, _, root = box
    log = sshd.work / "sshd.log"

    def accepted() -> int:
        return log.read_text(errors="replace").count("Accepted publickey")

    n0 = accepted()
    shared = deploy(target(box), bundles["v1"])
    n1 = accepted()
    per_call = deploy(target(box), bundles["v2"], share_connection=False)
    n2 = accepted()
    assert shared.ok and per_call.ok and per_call.active_before == shared.active_after
    assert list(shared.seconds) == list(per_call.seconds) == ["probe", "hold", "upload", "verify", "golden",
                                                              "latency", "switch"]
    assert n1 - n0 == 1 and n2 - n1 == len(per_call.seconds)
    masters = subprocess.run(["pgrep", "-f", "ControlMaster=yes"], capture_output=True, text=True).stdout.split()
    assert masters == []                        # the master ended with the deploy
    assert serves(root)["ok"]


def test_no_shell_injection(box, bundles, tmp_path):
    sshd, cfg, _ = box
    canary = tmp_path / "PWNED"
    evil_dir = tmp_path / f"it's $(touch {canary}); touch {canary}"
    res = CliRunner().invoke(main, ["deploy", str(bundles["v1"]), "--host", "box", "--ssh-config", str(cfg),
                                    "--remote-python", sshd.python, "--install-dir", str(evil_dir), "--json"])
    assert res.exit_code == 0, res.output
    assert (evil_dir / "current" / MANIFEST).is_file() and not canary.exists()
    for host in (f"-oProxyCommand=touch {canary}", f"box;touch {canary}", f"$(touch {canary})", "box -p 1"):
        res = CliRunner().invoke(main, ["deploy", str(bundles["v1"]), "--host", host, "--ssh-config", str(cfg)])
        assert res.exit_code == 3, (host, res.output)
    assert not canary.exists()
    named = shutil.copytree(bundles["v1"], tmp_path / "b;touch PWNED")
    res = CliRunner().invoke(main, ["deploy", str(named), "--host", "box", "--ssh-config", str(cfg),
                                    "--remote-python", sshd.python, "--install-dir", str(tmp_path / "i2")])
    assert res.exit_code == 0 and not canary.exists() and not Path("PWNED").exists()


def test_remote_hil_checks_run_on_the_box(box, bundles):
    from edgehft.deploy.remote import RemoteTarget
    from edgehft.errors import DeployError
    sshd, cfg, root = box
    rt = RemoteTarget("box", "cpu", ssh_config=str(cfg), remote_python=sshd.python, install_dir=str(root))
    with pytest.raises(DeployError, match="no active bundle"):
        rt.golden()
    v = deployed(box, bundles["v1"])["version"]
    g = rt.golden()
    assert (g["ok"], g["count"], g["matched"], g["bundle"]) == (True, 16, 16, str(root / "versions" / v))
    lat = rt.latency(samples=50, warmup=5, budget_p99=1e9, budget_p999=1e9)
    assert lat["ok"] is True and lat["samples"] == 50 and lat["host"] == "box"
    # the calibration feed the manifest names exists on this box, but the checks never read a bundle's paths
    assert lat["source"]["kind"] == "golden" and lat["mode"] == "max"
    slow = rt.latency(samples=20, warmup=0, budget_p99=0.001)
    assert slow["ok"] is False and slow["verdicts"]["p99"]["ok"] is False


def test_hil_plugin_against_the_box(box, bundles, tmp_path):
    """``pytest --edgehft-board cpu --edgehft-host box``: the plugin's checks run on the box's active bundle."""
    sshd, cfg, root = box
    v = deployed(box, bundles["v1"])["version"]
    out = tmp_path / "hil.json"
    r = subprocess.run([os.sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--edgehft-board=cpu",
                        "--edgehft-host=box", f"--edgehft-ssh-config={cfg}", f"--edgehft-remote-python={sshd.python}",
                        f"--edgehft-install-dir={root}", "--edgehft-samples=50", "--edgehft-warmup=5",
                        "--edgehft-budget-p99=1e9", "--edgehft-budget-p999=1e9", f"--edgehft-json={out}"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "300"})
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(out.read_text())
    g, lat = rep["checks"]["golden"], rep["checks"]["latency"]
    assert (g["ok"], g["matched"], g["count"], g["bundle"], g["host"]) == (True, 16, 16, str(root / "versions" / v), "box")
    assert lat["ok"] is True and lat["samples"] == 50


def test_client_killed_during_golden_leaves_nothing_staged(box, bundles, serving_v1):
    """The deploy dies while the box runs the golden vectors (the agent pauses there): its ssh connections
    die with it, and the box's agents remove the staged version themselves (the one holding the box sees its
    connection end without "done", the golden one cannot deliver its result); the box keeps serving v1."""
    sshd, _, root = box
    cfg = sshd.config("ssh_pause", failpoints="golden:before-result=pause")
    proc = subprocess.Popen([os.sys.executable, "-m", "edgehft", "deploy", str(bundles["v2"]), "--host", "box",
                             "--ssh-config", str(cfg), "--remote-python", sshd.python, "--install-dir", str(root)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:                                     # the step lines: "box golden …"
        if "golden" in line:
            break
    time.sleep(2.5)                                              # inside the golden step's 5 s pause
    proc.kill()
    proc.wait()
    assert wait_no_partial(root) == []                           # incoming/ empty: discarded by the agent
    assert_unchanged(root, serving_v1)
    history = json.loads(cli(box, "status", "--host", "box", "--json").output)["status"]["history"]
    assert history[-1]["event"] == "failed"
    assert history[-1]["reason"].startswith(("golden: the ", "the deploy went away (its connection closed"))


def test_status_flags_a_corrupted_active_version(box, bundles, serving_v1):
    _, _, root = box
    with open(root / "current" / "golden.npz", "ab") as fh:
        fh.write(b"\0")
    res = cli(box, "status", "--host", "box")
    text = " ".join(res.output.split())
    assert res.exit_code == 6 and "does not match its manifest" in text and "golden.npz changed" in text
