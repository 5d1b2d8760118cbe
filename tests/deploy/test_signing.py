"""Signed bundles (edgehft/signing.py): OpenSSH's ``ssh-keygen -Y sign/verify`` with real ed25519 keys made
here, ``runtime.open(require_signature=...)``, the CLI's exit codes, and deploys to the real loopback sshd
box (tests/sshbox.py) whose install dir has an ``allowed_signers`` file."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner

from edgehft import runtime
from edgehft.bundle import MANIFEST, load_bundle, sha256_file
from edgehft.bundle_checks import check_golden
from edgehft.cli import main
from edgehft.deploy.deploy import deploy
from edgehft.deploy.ssh import parse_target
from edgehft.errors import BoardUnavailableError, BundleError, InputError
from edgehft.signing import (ALLOWED_SIGNERS, NAMESPACE, REVOKED, SIGNATURE, SignatureError, check_tool,
                             sign_bundle, verify_bundle)


def keygen(path: Path, comment: str) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], check=True)
    return path


def signer_line(principal: str, key: Path, options: str = f'namespaces="{NAMESPACE}"') -> str:
    kind, b64 = (key.with_name(key.name + ".pub")).read_text().split()[:2]
    return f"{principal} {options} {kind} {b64}\n"


def fingerprint(key: Path) -> str:
    """``ED25519 SHA256:…`` as ssh-keygen -l prints it."""
    bits, fp, *_, kind = subprocess.run(["ssh-keygen", "-l", "-f", str(key) + ".pub"], check=True,
                                        capture_output=True, text=True).stdout.split()
    return f"{kind.strip('()')} {fp}"


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """Two real ed25519 keys and an allowed_signers file that trusts alice only (for bundles)."""
    d = tmp_path_factory.mktemp("keys")
    k = SimpleNamespace(alice=keygen(d / "alice", "alice@desk"), mallory=keygen(d / "mallory", "mallory@elsewhere"),
                        allowed=d / ALLOWED_SIGNERS)
    k.allowed.write_text(signer_line("alice@desk", k.alice))
    return k


@pytest.fixture
def unsigned(deeplob_bundle, tmp_path) -> Path:
    return Path(shutil.copytree(deeplob_bundle, tmp_path / "unsigned"))


@pytest.fixture
def signed(deeplob_bundle, keys, tmp_path) -> Path:
    b = Path(shutil.copytree(deeplob_bundle, tmp_path / "signed"))
    sign_bundle(b, keys.alice)
    return b


def rehash(bundle: Path) -> None:
    """Update the manifest's hashes after a file changed (what someone altering a bundle would do)."""
    m = json.loads((bundle / MANIFEST).read_text())
    m["files"] = {rel: sha256_file(bundle / rel) for rel in m["files"]}
    (bundle / MANIFEST).write_text(json.dumps(m, indent=1))


def change_golden(bundle: Path) -> None:
    with np.load(bundle / "golden.npz") as z:
        arrays = {k: z[k].copy() for k in z.files}
    key = next(k for k in arrays if k.startswith("outputs/"))
    arrays[key][0] = arrays[key][0] + 1
    np.savez(bundle / "golden.npz", **arrays)


# -- signing and verifying ------------------------------------------------------------------------------
def test_sign_writes_an_openssh_signature_over_the_manifest(signed, keys, deeplob_bundle):
    sig = signed / SIGNATURE
    assert sig.read_text().startswith("-----BEGIN SSH SIGNATURE-----")
    assert (signed / MANIFEST).read_bytes() == (deeplob_bundle / MANIFEST).read_bytes()   # manifest untouched
    assert SIGNATURE not in load_bundle(signed).manifest.files and load_bundle(signed, verify=True)
    got = verify_bundle(signed, keys.allowed)
    assert got == {"principal": "alice@desk", "key": fingerprint(keys.alice), "allowed_signers": str(keys.allowed)}
    # OpenSSH itself agrees: a plain ssh-keygen -Y verify in our namespace over manifest.json's bytes
    r = subprocess.run(["ssh-keygen", "-Y", "verify", "-f", str(keys.allowed), "-I", "alice@desk", "-n", NAMESPACE,
                        "-s", str(sig)], input=(signed / MANIFEST).read_bytes(), capture_output=True)
    assert r.returncode == 0 and b'Good "edgehft-bundle" signature for alice@desk' in r.stdout


def test_an_altered_bundle_is_refused(signed, keys):
    change_golden(signed)
    with pytest.raises(BundleError, match="golden.npz changed"):        # signature fine, hash not
        runtime.open(signed, require_signature=keys.allowed)
    rehash(signed)                                                      # now the hashes match: the manifest changed
    load_bundle(signed, verify=True)
    with pytest.raises(SignatureError, match=r"alice@desk does not verify: manifest.json changed after it was "
                                             r"signed") as e:
        verify_bundle(signed, keys.allowed)
    assert e.value.exit_code == 6


def test_wrong_key_unsigned_and_wrong_namespace_are_refused(signed, unsigned, keys, tmp_path):
    with pytest.raises(SignatureError, match=r"is not signed \(no manifest.json.sig\)"):
        verify_bundle(unsigned, keys.allowed)
    sign_bundle(unsigned, keys.mallory)
    with pytest.raises(SignatureError, match=f"signed by key {re.escape(fingerprint(keys.mallory))}, which .* does not trust"):
        verify_bundle(unsigned, keys.allowed)
    # alice's key, but a signature made for another purpose (git's namespace) over the same bytes
    git_sig = tmp_path / "git"
    shutil.copy(signed / MANIFEST, git_sig)
    subprocess.run(["ssh-keygen", "-q", "-Y", "sign", "-f", str(keys.alice), "-n", "git", str(git_sig)], check=True,
                   capture_output=True)
    shutil.copy(tmp_path / "git.sig", signed / SIGNATURE)
    with pytest.raises(SignatureError, match="namespace does not match"):
        verify_bundle(signed, keys.allowed)
    (signed / SIGNATURE).write_text("not a signature\n")
    with pytest.raises(SignatureError, match="signed by a key, which .* does not trust"):
        verify_bundle(signed, keys.allowed)


def test_expired_revoked_and_restricted_keys_are_refused(signed, keys, tmp_path):
    expired = tmp_path / "expired" / ALLOWED_SIGNERS
    expired.parent.mkdir()
    expired.write_text(signer_line("alice@desk", keys.alice, f'namespaces="{NAMESPACE}",valid-before="20200101"'))
    with pytest.raises(SignatureError, match="key has expired"):
        verify_bundle(signed, expired)
    git_only = tmp_path / "git_only"
    git_only.write_text(signer_line("alice@desk", keys.alice, 'namespaces="git"'))
    with pytest.raises(SignatureError, match='not permitted for use in signature namespace "edgehft-bundle"'):
        verify_bundle(signed, git_only)
    (keys.allowed.parent / REVOKED).write_text((keys.alice.parent / "alice.pub").read_text())
    try:
        with pytest.raises(SignatureError, match=f"the key is revoked in {keys.allowed.parent / REVOKED}"):
            verify_bundle(signed, keys.allowed)
    finally:
        (keys.allowed.parent / REVOKED).unlink()
    assert verify_bundle(signed, keys.allowed)["principal"] == "alice@desk"


def test_runtime_open_require_signature(signed, unsigned, keys, tmp_path):
    with runtime.open(signed, require_signature=keys.allowed) as r:
        assert check_golden(r)["ok"]
    with runtime.open(unsigned) as r:                                   # not asked: no check, as before
        assert check_golden(r)["ok"]
    with pytest.raises(SignatureError, match="is not signed"):
        runtime.open(unsigned, require_signature=keys.allowed)
    with pytest.raises(InputError, match="not in an install dir"):
        runtime.open(signed, require_signature=True)
    # True: the install dir's allowed_signers, for <dir>/current -> versions/<vid>
    root = tmp_path / "install"
    shutil.copytree(signed, root / "versions" / "v1")
    os.symlink("versions/v1", root / "current")
    with pytest.raises(InputError, match=f"{root / ALLOWED_SIGNERS} is not a readable file"):
        runtime.open(root / "current", require_signature=True)
    (root / ALLOWED_SIGNERS).write_text(signer_line("mallory@elsewhere", keys.mallory))
    with pytest.raises(SignatureError, match="does not trust"):
        runtime.open(root / "current", require_signature=True)
    shutil.copy(keys.allowed, root / ALLOWED_SIGNERS)
    with runtime.open(root / "current", require_signature=True) as r:
        assert r.bundle.path == root / "versions" / "v1" and check_golden(r)["ok"]


def test_box_check_fails_closed(signed, keys, tmp_path):
    """``check_install_dir`` (what Store.verify/rollback call): no file, no check; a dangling
    ``allowed_signers`` link or a symlinked signature is a refusal, never a pass."""
    from edgehft.errors import DeployError
    from edgehft.signing import check_install_dir
    root = tmp_path / "root"
    root.mkdir()
    assert check_install_dir(signed, root) is None
    os.symlink(tmp_path / "nowhere", root / ALLOWED_SIGNERS)
    with pytest.raises(DeployError, match=r"verification failed on the box: allowed_signers file .* is not a "
                                          r"readable file") as e:
        check_install_dir(signed, root)
    assert e.value.exit_code == 9
    (root / ALLOWED_SIGNERS).unlink()
    shutil.copy(keys.allowed, root / ALLOWED_SIGNERS)
    assert check_install_dir(signed, root)["principal"] == "alice@desk"
    shutil.move(signed / SIGNATURE, tmp_path / "elsewhere.sig")
    os.symlink(tmp_path / "elsewhere.sig", signed / SIGNATURE)
    with pytest.raises(DeployError, match="manifest.json.sig is not a regular file"):
        check_install_dir(signed, root)


def old_ssh_keygen(bindir: Path, stderr: str) -> None:
    """An ``ssh-keygen`` that answers ``-Y`` as OpenSSH before 8.2 does (we cannot install an old OpenSSH)."""
    bindir.mkdir()
    script = bindir / "ssh-keygen"
    script.write_text("#!/bin/sh\n" + "".join(f"echo '{line}' >&2\n" for line in stderr.splitlines()) + "exit 1\n")
    script.chmod(0o755)


def test_missing_or_too_old_ssh_keygen(signed, keys, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(BoardUnavailableError, match="ssh-keygen is not installed") as e:
        verify_bundle(signed, keys.allowed)
    assert e.value.exit_code == 7 and "openssh-client" in e.value.hint
    old_ssh_keygen(tmp_path / "v7", "ssh-keygen: illegal option -- Y\nusage: ssh-keygen [-q] [-b bits]")
    monkeypatch.setenv("PATH", str(tmp_path / "v7"))
    with pytest.raises(BoardUnavailableError, match="too old for bundle signatures"):
        verify_bundle(signed, keys.allowed)
    old_ssh_keygen(tmp_path / "v81", "usage: ssh-keygen [-q] [-b bits]\n"
                                     "       ssh-keygen -Y sign -f key_file -n namespace file ...")
    monkeypatch.setenv("PATH", str(tmp_path / "v81"))
    with pytest.raises(BoardUnavailableError, match="too old .*-Y find-principals"):
        check_tool()


def test_encrypted_key_asks_for_its_passphrase_on_the_terminal(unsigned, tmp_path):
    """The passphrase is read from the terminal (a pty here), never from a pipe; without a terminal the
    signing fails at once (exit 3) instead of waiting."""
    import pty
    import select
    import sys
    locked = tmp_path / "locked"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "s3cret", "-C", "carol@desk", "-f", str(locked)],
                   check=True)
    cmd = [sys.executable, "-m", "edgehft", "sign", str(unsigned), "--key", str(locked)]
    r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, start_new_session=True,
                       timeout=60)
    assert r.returncode == 3 and "incorrect passphrase" in r.stderr and not (unsigned / SIGNATURE).exists()
    pid, fd = pty.fork()
    if pid == 0:                                                # the child: edgehft sign on a terminal
        os.execv(sys.executable, cmd)
    seen = b""
    while b"passphrase" not in seen and select.select([fd], [], [], 30)[0]:
        seen += os.read(fd, 1024)
    os.write(fd, b"s3cret\n")
    while select.select([fd], [], [], 30)[0]:
        try:
            chunk = os.read(fd, 1024)
        except OSError:                                         # the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0, seen
    allowed = tmp_path / ALLOWED_SIGNERS
    allowed.write_text(signer_line("carol@desk", locked))
    assert verify_bundle(unsigned, allowed)["principal"] == "carol@desk"


# -- command line ---------------------------------------------------------------------------------------
def test_sign_command_exit_codes(unsigned, keys, tmp_path, monkeypatch):
    res = CliRunner().invoke(main, ["sign", str(unsigned), "--key", str(keys.alice), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["key"] == fingerprint(keys.alice) and out["signature"] == str(unsigned / SIGNATURE)
    assert out["public_key"] == (keys.alice.parent / "alice.pub").read_text().strip()
    assert verify_bundle(unsigned, keys.allowed)["principal"] == "alice@desk"
    not_a_key = tmp_path / "notakey"
    not_a_key.write_text("hello\n")
    res = CliRunner().invoke(main, ["sign", str(unsigned), "--key", str(not_a_key)])
    assert res.exit_code == 3 and "could not sign with" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(main, ["sign", str(tmp_path), "--key", str(keys.alice)])
    assert res.exit_code == 6 and "is not an edgehft bundle" in " ".join(res.output.split())
    (unsigned / SIGNATURE).unlink()
    with monkeypatch.context() as m:
        m.setenv("PATH", str(tmp_path / "empty"))
        res = CliRunner().invoke(main, ["sign", str(unsigned), "--key", str(keys.alice)])
        assert res.exit_code == 7 and "ssh-keygen is not installed" in res.output
    change_golden(unsigned)                                     # never sign a bundle that fails its hashes
    res = CliRunner().invoke(main, ["sign", str(unsigned), "--key", str(keys.alice)])
    assert res.exit_code == 6 and "golden.npz changed" in res.output and not (unsigned / SIGNATURE).exists()


def test_run_require_signature_exit_codes(signed, unsigned, keys):
    res = CliRunner().invoke(main, ["run", str(signed), "--golden", "--require-signature", str(keys.allowed), "--json"])
    assert res.exit_code == 0 and json.loads(res.output)["matched"] == 16, res.output
    def run_json(bundle):
        res = CliRunner().invoke(main, ["run", str(bundle), "--golden", "--require-signature", str(keys.allowed),
                                        "--json"])
        return res.exit_code, json.loads(res.output)["error"]

    code, error = run_json(unsigned)
    assert code == 6 and "is not signed" in error
    sign_bundle(unsigned, keys.mallory)
    code, error = run_json(unsigned)
    assert code == 6 and "does not trust" in error
    res = CliRunner().invoke(main, ["bench", str(signed), "--profile", "--samples", "2", "--require-signature",
                                    str(keys.allowed)])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["bench", str(unsigned), "--profile", "--samples", "2", "--require-signature",
                                    str(keys.allowed)])
    assert res.exit_code == 6 and "does not trust" in res.output


def test_compile_sign(deeplob_bundle, keys, tmp_path, monkeypatch):
    """``compile --sign KEY`` on a quantized .tflite (taken as is: no converter run)."""
    model = deeplob_bundle / "model.tflite"
    res = CliRunner().invoke(main, ["compile", str(model), "--board", "cpu", "--out", str(tmp_path / "b"),
                                    "--sign", str(keys.alice), "--json"])
    assert res.exit_code == 0, res.output
    sig = json.loads(res.output.splitlines()[-1])["signature"]
    assert sig["key"] == fingerprint(keys.alice) and sig["signature"] == str(tmp_path / "b" / SIGNATURE)
    assert verify_bundle(tmp_path / "b", keys.allowed)["principal"] == "alice@desk"
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))       # said before compiling, nothing written
    res = CliRunner().invoke(main, ["compile", str(model), "--board", "cpu", "--out", str(tmp_path / "c"),
                                    "--sign", str(keys.alice)])
    assert res.exit_code == 7 and "ssh-keygen is not installed" in res.output and not (tmp_path / "c").exists()


# -- deploy to a box whose install dir has allowed_signers ------------------------------------------------
@pytest.fixture
def box(ssh_box, tmp_path, keys):
    """(sshd, client config, an install dir that trusts alice's key)."""
    root = tmp_path / "install"
    root.mkdir()
    shutil.copy(keys.allowed, root / ALLOWED_SIGNERS)
    return ssh_box, ssh_box.config(f"ssh_config_{tmp_path.name}"), root


def to(box, root=None):
    sshd, cfg, install = box
    return parse_target("box", python=sshd.python, install_dir=str(root or install), ssh_config=str(cfg))


def cli(box, *args):
    sshd, cfg, root = box
    return CliRunner().invoke(main, [*args, "--host", "box", "--ssh-config", str(cfg), "--remote-python", sshd.python,
                                     "--install-dir", str(root)])


def state(root: Path) -> dict:
    """Where current points, every file of that version with its SHA-256, and its golden vectors' result."""
    active = root / os.readlink(root / "current")
    with runtime.open(root / "current") as r:
        golden = check_golden(r)
    return {"current": os.readlink(root / "current"), "golden_ok": golden["ok"], "matched": golden["matched"],
            "files": {str(p.relative_to(active)): sha256_file(p) for p in sorted(active.rglob("*")) if p.is_file()}}


def test_box_with_allowed_signers_takes_only_signed_bundles(box, signed, unsigned, keys, tmp_path):
    _, _, root = box
    ok = deploy(to(box), signed)
    assert ok.ok and ok.exit_code == 0, ok
    before = state(root)
    assert before["golden_ok"] and before["matched"] == 16 and SIGNATURE in before["files"]
    forged = Path(shutil.copytree(signed, tmp_path / "forged"))
    change_golden(forged)
    rehash(forged)                                              # hashes consistent, alice's signature now stale
    mallory = Path(shutil.copytree(unsigned, tmp_path / "mallory"))
    sign_bundle(mallory, keys.mallory)
    for bundle, why in ((unsigned, "is not signed"), (mallory, "does not trust"),
                        (forged, "manifest.json changed after it was signed")):
        res = deploy(to(box), bundle)
        assert (res.ok, res.step, res.exit_code) == (False, "verify", 9), res
        assert "verification failed on the box: " in res.error and why in res.error, res.error
        assert "edgehft sign BUNDLE --key KEY" in res.hint
        assert state(root) == before                            # current unchanged and still passes golden
        assert not list((root / "incoming").iterdir())          # the refused copy was discarded
    res = cli(box, "deploy", str(unsigned))
    assert res.exit_code == 9 and "is not signed" in res.output and "Traceback" not in res.output
    assert state(root) == before


def test_rollback_target_is_rechecked(box, signed, keys):
    _, _, root = box
    first, second = deploy(to(box), signed), deploy(to(box), signed)
    assert first.ok and second.ok and first.version != second.version
    (root / REVOKED).write_text((keys.alice.parent / "alice.pub").read_text())    # alice's key revoked
    before = state(root)
    res = cli(box, "rollback")
    assert res.exit_code == 9, res.output
    assert f"refusing to roll back to {first.version}" in " ".join(res.output.split())
    assert "revoked" in res.output
    assert state(root) == before and before["current"] == f"versions/{second.version}"
    (root / REVOKED).unlink()
    res = cli(box, "rollback", "--json")
    assert res.exit_code == 0 and json.loads(res.output)["active"] == first.version


def test_signed_bundle_on_a_box_without_allowed_signers(ssh_box, signed, tmp_path):
    """The signature travels and is not an "extra file" on a box that does not require signatures."""
    root = tmp_path / "plain"
    res = deploy(to((ssh_box, ssh_box.config(f"ssh_config_{tmp_path.name}"), root)), signed)
    assert res.ok, res
    assert (root / "current" / SIGNATURE).read_bytes() == (signed / SIGNATURE).read_bytes()
