"""The deploy fault matrix, continued (tests/deploy/test_deploy.py holds its first part; the helpers used here are tests/deploy_box.py),
on the real sshd on 127.0.0.1: a switch whose log line cannot be written (a full disk at history.jsonl), a
box installed before the ``previous`` link, a stalled link, concurrent deploys, an agent killed by SIGSEGV.
Each fault test asserts that ``current`` and the previous version are intact and pass their golden vectors.
The last tests check the ssh exit-status rules without a box (OpenSSH 9.2's behaviour, measured)."""
from __future__ import annotations

import fcntl
import io
import json
import os
import tarfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from edgehft import runtime
from edgehft.bundle import MANIFEST, load_bundle, sha256_file
from edgehft.bundle_checks import check_golden
from edgehft.deploy.deploy import box_status, deploy, rollback
from edgehft.deploy.ssh import agent_outcome, parse_target, ssh_argv
from edgehft.deploy.store import Store
from edgehft.errors import DeployError, RemoteError
from deploy_box import bundles, box, cli, deployed, target, tiny_disk, wait_no_partial  # noqa: F401 (fixtures)


def files_of(d: Path) -> dict:
    return {str(p.relative_to(d)): sha256_file(p) for p in sorted(d.rglob("*")) if p.is_file()}


def state(root: Path) -> dict:
    """Where ``current`` and ``previous`` point, and every file of both versions with its SHA-256."""
    return {link: {"target": os.readlink(root / link), "files": files_of(root / os.readlink(root / link))}
            for link in ("current", "previous")}


def assert_intact(root: Path, before: dict | None = None) -> None:
    """``current`` and ``previous`` are what ``before`` recorded (if given), and both versions open as a
    serving process opens them and reproduce their golden vectors."""
    if before is not None:
        assert state(root) == before
    for link in ("current", "previous"):
        with runtime.open(root / link) as r:
            g = check_golden(r)
        assert g["ok"] and g["matched"] == g["count"] == 16, (link, g)


@pytest.fixture
def serving_two(box, bundles):
    """A box serving v2, with v1 as its previous version; returns :func:`state`."""
    deployed(box, bundles["v1"])
    deployed(box, bundles["v2"])
    return state(box[2])


def history_rows(root: Path) -> list:
    """Every line of history.jsonl, parsed (a half line fails the test)."""
    return [json.loads(line) for line in (root / "history.jsonl").read_text().splitlines()]


def fill_disk_at_the_log(disk: Path, root: Path) -> None:
    """Pad history.jsonl with a valid line to one byte short of a page, then fill the disk: the next
    appended line gets its first byte in and ENOSPC for the rest, which is how the field's activate line
    was cut to ``{``."""
    log = root / "history.jsonl"
    page = os.sysconf("SC_PAGE_SIZE")
    head, tail = '{"event": "pad", "x": "', '"}\n'
    pad = (page - 1 - log.stat().st_size) % page
    pad += page if pad < len(head) + len(tail) else 0
    with open(log, "a") as fh:
        fh.write(head + "x" * (pad - len(head) - len(tail)) + tail)
    assert log.stat().st_size % page == page - 1
    with open(disk / "ballast", "wb", buffering=0) as fh:
        for chunk in (1 << 16, 1 << 12):
            try:
                while True:
                    fh.write(b"\0" * chunk)
            except OSError:
                pass


@pytest.mark.parametrize("how", ["failpoint", "full-disk"])
def test_a_switch_that_cannot_be_logged_prunes_nothing_and_says_so(box, bundles, how, request):
    """The field's bug: the disk filled during a deploy, the activate line became ``{``, the previous version
    was pruned as "not previous", rollback was impossible, and deploy said success. Now the links say what
    the previous version is, a failed log write skips pruning, and the deploy result carries the warning."""
    sshd, _, root = box
    if how == "full-disk":
        disk = request.getfixturevalue("tiny_disk")     # a 4 MiB tmpfs (root only)
        root = disk / "install"
    tgt = target(box, install=root)
    first, second = deploy(tgt, bundles["v1"]), deploy(tgt, bundles["v2"])
    assert first.ok and second.ok
    before = state(root)
    if how == "failpoint":                              # the append raises ENOSPC after the line's first byte
        faulty, hook = target(box, sshd.config("ssh_enospc", failpoints="history:activate=enospc"), install=root), None
    else:
        faulty, hook = tgt, (lambda step, t, ctx: fill_disk_at_the_log(disk, root) if step == "switch" else None)
    res = deploy(faulty, bundles["v1"], keep=1, on_step=hook)
    if how == "full-disk":
        (disk / "ballast").unlink()
    assert (res.ok, res.exit_code, res.active_after) == (True, 0, res.version), res
    assert len(res.warnings) == 1 and "could not log activate" in res.warnings[0], res.warnings
    assert "No space left on device" in res.warnings[0] and "no old version was pruned" in res.warnings[0]
    # keep=1 would drop v1; unsure of its own log, the box kept everything
    assert sorted(p.name for p in (root / "versions").iterdir()) == sorted([first.version, second.version,
                                                                              res.version])
    assert os.readlink(root / "current") == f"versions/{res.version}"
    assert state(root)["previous"] == before["current"]          # v2, intact, from the link
    assert_intact(root)
    assert files_of(root / "versions" / first.version) == before["previous"]["files"]
    rows = history_rows(root)                                    # no half line left behind
    assert not [r for r in rows if r.get("event") == "activate" and r["version"] == res.version]
    st = box_status(tgt)["status"]
    assert (st["active"], st["previous"], st["previous_source"]) == (res.version, second.version, "link")
    rb = rollback(tgt)
    assert (rb["active"], rb["previous"], rb["warnings"]) == (second.version, res.version, [])
    assert state(root)["current"] == before["current"] and state(root)["previous"]["target"] == f"versions/{res.version}"
    assert_intact(root)


def test_a_box_installed_before_the_previous_link(box, bundles):
    """No ``previous`` link (an older edgehft installed the box): the history says; the history's line cut
    to ``{`` too: the newest other version, said as a guess; new switches write the link."""
    sshd, _, root = box
    tgt = target(box)
    v1, v2 = deployed(box, bundles["v1"])["version"], deployed(box, bundles["v2"])["version"]
    (root / "previous").unlink()
    st = box_status(tgt)["status"]
    assert (st["previous"], st["previous_source"]) == (v1, "history")
    log = root / "history.jsonl"
    lines = log.read_text().splitlines()
    assert json.loads(lines[-1])["version"] == v2
    log.write_text("\n".join(lines[:-1] + ["{"]))                 # v2's activate line cut short, no newline
    st = box_status(tgt)["status"]
    assert (st["previous"], st["previous_source"]) == (v1, "newest")
    rb = rollback(tgt)
    assert (rb["active"], rb["previous"]) == (v1, v2) and "newest other version" in rb["warnings"][0]
    assert os.readlink(root / "previous") == f"versions/{v2}"   # from now on the link says
    assert rollback(tgt) == {"active": v2, "previous": v1, "warnings": []}
    rows = [json.loads(x) for x in log.read_text().splitlines() if x != "{"]   # appended after the half line
    assert [r["event"] for r in rows[-2:]] == ["rollback", "rollback"]
    assert_intact(root)
    v3 = deploy(tgt, bundles["v1"], keep=2)
    assert v3.ok and v3.warnings == []
    assert sorted(p.name for p in (root / "versions").iterdir()) == sorted([v2, v3.version])
    assert os.readlink(root / "previous") == f"versions/{v2}"
    assert_intact(root)


def _install(store: Store, tar: bytes, vid: str, keep: int) -> dict:
    store.receive(vid, io.BytesIO(tar), len(tar), {})
    return store.activate(vid, keep=keep)


def test_no_pruning_when_unsure_what_was_active(tmp_path, deeplob_bundle):
    """The Store on its own (no sshd): a switch on a box whose ``current`` was missing prunes nothing."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for rel in [*load_bundle(deeplob_bundle).manifest.files, MANIFEST]:
            tar.add(deeplob_bundle / rel, arcname=rel)
    store, vids = Store(tmp_path / "install"), [f"20261130T00000{i}Z-0123456789ab-cde{i}" for i in range(5)]
    for v in vids[:3]:
        _install(store, buf.getvalue(), v, keep=0)
    assert store.previous_info() == (vids[1], "link")
    store.current.unlink()                           # what the box served before the next switch: unknown
    res = _install(store, buf.getvalue(), vids[3], keep=1)
    assert (res["previous"], res["pruned"]) == (None, []) and store.installed() == vids[:4]
    res = _install(store, buf.getvalue(), vids[4], keep=1)      # known again: active and previous stay
    assert (res["previous"], res["pruned"]) == (vids[3], vids[:3])
    assert store.installed() == vids[3:] and store.previous_info() == (vids[3], "link")


def wait_free(lock: Path, timeout: float = 20.0) -> bool:
    """True once nobody holds ``lock`` (an flock), polling for up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        fd = os.open(lock, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            time.sleep(0.2)
        finally:
            os.close(fd)
    return False


def test_stalled_link(box, bundles, serving_two, tmp_path):
    """Mid-upload the link goes silent for every connection of the deploy (open, no bytes, no FIN), and
    stays so: the client gives up after its keepalives (exit 10), and on the box the receiving agent and
    the agent holding the box give up after their idle timeout (3 s here), remove the partial transfer and
    free the box, although sshd still sees the connections open."""
    sshd, _, root = box
    link = tmp_path / "link-stalled"
    cfg = sshd.config("ssh_stall", stall_after=60_000, stall_link=link)
    stalled = parse_target("box", python=sshd.python, install_dir=str(root), ssh_config=str(cfg), idle_timeout=3)
    assert "ServerAliveInterval=1" in ssh_argv(stalled, ["true"])
    res = deploy(stalled, bundles["v1"])
    assert (res.ok, res.step, res.exit_code) == (False, "upload", 10), res
    assert "the link to the box stalled" in res.error and "not responding" in res.error
    assert link.exists()                                         # it was the stall, not something else
    assert wait_no_partial(root, timeout=20) == []               # the receiving agent removed its transfer
    assert wait_free(root / "deploy.hold") and wait_free(root / "deploy.lock")
    assert_intact(root, serving_two)
    failed = [r for r in history_rows(root) if r.get("event") == "failed" and r.get("version") == res.version]
    assert failed and failed[0]["reason"] == "no byte from the deploy for 3 s: the link stalled or the deploy is gone"
    again = deployed(box, bundles["v1"])                         # the box is not held: the next deploy goes through
    assert os.readlink(root / "current") == f"versions/{again['version']}"
    assert state(root)["previous"] == serving_two["current"]
    assert_intact(root)


def test_concurrent_deploys_one_switches_the_others_are_refused(box, bundles, serving_two):
    """Four deploys probe the box, then race for it: one holds it and switches; the others are refused
    (exit 9) with the holder's version, host, pid and start time, and leave nothing on the box."""
    _, _, root = box
    tgt = target(box)
    gate = threading.Barrier(4)

    def race(step, t, ctx):
        if step == "hold":
            gate.wait(timeout=120)                               # all four have probed the same box

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda k: deploy(tgt, bundles[k], on_step=race), ["v1", "v2", "v1", "v2"]))
    won = [r for r in results if r.ok]
    assert len(won) == 1, [(r.ok, r.step, r.error) for r in results]
    w = won[0]
    assert os.readlink(root / "current") == f"versions/{w.version}" and w.active_after == w.version
    assert state(root)["previous"] == serving_two["current"]
    for r in results:
        if r is w:
            continue
        assert r.exit_code == 9 and r.step in ("hold", "switch"), r
        others = [o.version for o in results if o is not r]
        assert any(v in r.error for v in others), r.error          # names the deploy that holds or switched it
        if r.step == "hold":
            assert "the box is held by another deploy: the deploy of" in r.error
            assert f"(pid {os.getpid()} there), holding the box since 20" in r.error and "agent pid" in r.error
        assert not (root / "incoming" / r.version).exists() and not (root / "versions" / r.version).exists()
    assert_intact(root)


def test_a_deploy_that_finds_the_box_switched_since_its_probe_is_refused(box, bundles, serving_two):
    """Another deploy runs start to end after this one probed the box (so this one's hold comes later and
    succeeds): the switch compares what is active with what the probe saw and refuses."""
    _, _, root = box
    tgt = target(box)
    other = {}

    def meanwhile(step, t, ctx):
        if step == "hold" and not other:
            other["res"] = deploy(tgt, bundles["v2"])

    late = deploy(tgt, bundles["v1"], on_step=meanwhile)
    first = other["res"]
    assert first.ok
    assert (late.ok, late.step, late.exit_code) == (False, "switch", 9), late
    was = Path(serving_two["current"]["target"]).name
    assert f"the box was switched from {was} to {first.version} by another deploy" in late.error
    assert "after this deploy probed it; nothing was switched" in late.error
    assert os.readlink(root / "current") == f"versions/{first.version}"
    assert state(root)["previous"] == serving_two["current"]
    assert not (root / "incoming" / late.version).exists() and not (root / "versions" / late.version).exists()
    assert_intact(root)


@pytest.mark.parametrize("point,step", [("golden:before-result=segv", "golden"),
                                        ("activate:before-switch=segv", "switch")])
def test_agent_killed_by_sigsegv_is_a_failure_on_the_box(box, bundles, serving_two, point, step):
    """A crash of the interpreter (SIGSEGV) is exit 9 at its step, naming the signal, never "SSH connection
    failed" (exit 10): during golden the crash is in the agent's child and the agent reports it; in the
    agent itself, ssh's status and the agent's faulthandler line say it."""
    sshd, _, root = box
    res = deploy(target(box, sshd.config(f"ssh_segv_{step}", failpoints=point)), bundles["v1"])
    assert (res.ok, res.step, res.exit_code) == (False, step, 9), res
    if step == "golden":
        assert "golden crashed on the box" in res.error and "killed by SIGSEGV (signal 11)" in res.error
    else:
        assert "the box agent `activate` was killed by SIGSEGV on the box" in res.error
    assert "SSH connection" not in res.error
    assert wait_no_partial(root) == []
    assert_intact(root, serving_two)
    assert deploy(target(box), bundles["v1"]).ok                 # nothing left holding the box


# -- ssh's exit status, without a box ---------------------------------------------------------------------
def test_ssh_exit_status_rules():
    t = parse_target("box", ssh_config="/dev/null", idle_timeout=30)
    argv = ssh_argv(t, ["true"], log_file="/tmp/x.log")
    assert argv[argv.index("-E") + 1] == "/tmp/x.log" and "LogLevel=DEBUG1" in argv
    assert "ServerAliveInterval=5" in argv and "ServerAliveCountMax=3" in argv
    ok = '{"ok": true, "result": {"a": 1}}\n'
    assert agent_outcome(t, "probe", 0, ok, "INFO: Created TensorFlow Lite XNNPACK delegate for CPU.\n", "") == \
        [{"ok": True, "result": {"a": 1}}]
    # a remote signal death: ssh 9.2 exits 255, prints nothing, and logs exit-signal at debug level 1;
    # the remote stderr (the runtime's chatter) must not make it look like ssh failing
    log = "debug1: client_input_channel_req: channel 0 rtype exit-signal reply 0\ndebug1: Exit status -1\n"
    with pytest.raises(DeployError, match="the box agent `golden` was killed by a signal on the box"):
        agent_outcome(t, "golden", 255, "", "INFO: Created TensorFlow Lite XNNPACK delegate for CPU.\n", log)
    with pytest.raises(DeployError, match="killed by SIGSEGV on the box without a result \\(Fatal Python error: "
                                          "Segmentation fault\\)"):
        agent_outcome(t, "golden", 255, "", "Fatal Python error: Segmentation fault\n\nCurrent thread:\n", log)
    with pytest.raises(DeployError, match="killed by SIGSEGV \\(status 139\\)"):   # a shell reporting 128+N
        agent_outcome(t, "golden", 139, "", "", "")
    with pytest.raises(RemoteError, match="the link to the box stalled"):
        agent_outcome(t, "receive", 255, "", "", "Authenticated to 127.0.0.1\nTimeout, server 127.0.0.1 not responding.\n")
    with pytest.raises(RemoteError, match="SSH connection failed or dropped \\(Connection to 127.0.0.1 closed"):
        agent_outcome(t, "receive", 255, "", "INFO: x\n", "debug1: x\nConnection to 127.0.0.1 closed by remote host.\n")
    with pytest.raises(DeployError, match="has no `hold` command"):
        agent_outcome(t, "hold", 2, "", "agent: error: argument command: invalid choice: 'hold' (choose from ...)\n", "")
