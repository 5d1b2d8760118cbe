"""Signed bundles: OpenSSH's own ``ssh-keygen -Y sign`` / ``-Y verify`` over the bundle's manifest. Runs on
the host (signing) and on the box (verifying); no TensorFlow, no cryptography of its own.

Design:

- **What is signed**: the bytes of ``manifest.json``, exactly as they are on disk. The manifest holds the
  SHA-256 of every other file of the bundle (``files``), so a good signature plus :meth:`Bundle.verify`
  covers the whole bundle; a file that is not listed in ``files`` is not covered (the box refuses such
  files anyway). The signature is checked before the manifest is parsed.
- **Where the signature lives**: ``manifest.json.sig`` (:data:`SIGNATURE`) next to the manifest, an armored
  SSH signature in namespace :data:`NAMESPACE` (``edgehft-bundle``), so a signature made for git or for
  another tool with the same key is never taken for a bundle signature. It is not listed in the manifest
  (it cannot hash itself); ``edgehft deploy`` carries it with the manifest, and the box's ``Store.verify``
  allows it as the one file besides ``manifest.json`` that ``files`` does not list. Re-compiling into the
  same ``--out`` replaces the bundle directory, signature included, so a stale signature never survives.
- **Who signed**: ``ssh-keygen -Y sign`` records no identity, and ``-Y verify`` needs one (``-I``). The
  verifier asks ``ssh-keygen -Y find-principals`` which principals of the ``allowed_signers`` file hold the
  signing key, then verifies as each of them until one passes (the namespace and the key's validity are
  checked by ``-Y verify``), and reports who signed (principal and key fingerprint).
- **Trust**: an ``allowed_signers`` file (OpenSSH's format, ``ssh-keygen(1)`` "ALLOWED SIGNERS"): one line
  per trusted key, ``principal [options] keytype base64``. Options that matter here:
  ``namespaces="edgehft-bundle"`` (restrict the key to bundles), ``valid-after="YYYYMMDD"`` and
  ``valid-before="YYYYMMDD"`` (OpenSSH 8.8+). They are checked against the current time, since an SSH
  signature carries no trusted time: once a key expires, every bundle it signed is refused, for a new
  deploy and for a rollback alike (a version already serving keeps serving; it is not re-checked).
  Revocation: a ``revoked_signers`` file (:data:`REVOKED`) next to ``allowed_signers``, if present, is
  passed as ``-Y verify -r`` (a KRL or a list of public keys); a signature by a key listed there is refused.
  Removing a key's line from ``allowed_signers`` has the same effect.
- **Where trust is configured**: on a box, ``<install_dir>/allowed_signers``. Its presence turns the check
  on: the box then refuses unsigned bundles and bundles signed by any key it does not list (deploy exit 9,
  nothing switched), at verify, at activate and at rollback (:func:`check_install_dir`). Locally,
  ``runtime.open(require_signature=...)`` and ``edgehft run/bench --require-signature FILE`` ask for the
  same check (:func:`require_signature`).
- **The tool**: ``ssh-keygen`` from ``$PATH``, called with an argument list (never a shell), stdin the data,
  a time limit on every call. ``-Y sign``/``-Y verify`` appeared in OpenSSH 8.1 and ``-Y find-principals``
  in 8.2, so 8.2 or newer is needed; a missing or older ``ssh-keygen`` is a
  :class:`~edgehft.errors.BoardUnavailableError` (exit 7) that says so.

Exit codes: a missing, damaged, foreign or non-verifying signature is a :class:`SignatureError` (a
:class:`~edgehft.errors.BundleError`, exit 6) locally and a :class:`~edgehft.errors.DeployError` (exit 9)
on the box; a key ``ssh-keygen`` cannot sign with is an :class:`~edgehft.errors.InputError` (exit 3).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from edgehft.bundle import MANIFEST, load_bundle
from edgehft.errors import BoardUnavailableError, BundleError, DeployError, EdgeHFTError, InputError

NAMESPACE = "edgehft-bundle"
SIGNATURE = MANIFEST + ".sig"
ALLOWED_SIGNERS = "allowed_signers"
REVOKED = "revoked_signers"
MAX_SIGNATURE_BYTES = 64 * 1024          # an armored ed25519 signature is ~300 B, RSA-4096 ~1 KiB
VERIFY_TIMEOUT_S = 30.0
SIGN_TIMEOUT_S = 300.0                   # a passphrase typed, or a FIDO key touched
_OLD = re.compile(r"(illegal|invalid|unknown) option -- '?Y|Unsupported operation for -Y")
_GOOD = re.compile(r"with (\S+) key (\S+)")
_TOO_OLD_HINT = ("install OpenSSH 8.2 or newer (Debian/Ubuntu: apt-get install openssh-client; it provides "
                 "ssh-keygen -Y find-principals/sign/verify)")


class SignatureError(BundleError):
    """A bundle's signature is missing, damaged, by a key the ``allowed_signers`` file does not trust (or that
    expired or was revoked), or does not match its manifest (exit 6)."""


def ssh_keygen() -> str:
    """The path of ``ssh-keygen`` on ``$PATH``.

    Raises:
        BoardUnavailableError: none there (exit 7).
    """
    path = shutil.which("ssh-keygen")
    if path is None:
        raise BoardUnavailableError("ssh-keygen is not installed on this machine (bundle signatures need "
                                    "OpenSSH's ssh-keygen -Y)", hint=_TOO_OLD_HINT)
    return path


def _too_old(stderr: str) -> bool:
    """``ssh-keygen`` refused the ``-Y`` operation itself: OpenSSH < 8.1 has no ``-Y``, 8.1 no
    ``find-principals`` (it prints its usage, which then does not list find-principals)."""
    return bool(_OLD.search(stderr)) or ("usage:" in stderr and "find-principals" not in stderr)


def _run(args: list[str], data: bytes | None, timeout: float, error=SignatureError,
         stdin_tty: bool = False) -> subprocess.CompletedProcess:
    """Run ``ssh-keygen`` with ``args`` (a list, no shell), ``data`` on stdin.

    Raises:
        BoardUnavailableError: ssh-keygen missing or too old for ``-Y``.
        ``error``: it did not finish in ``timeout`` seconds.
    """
    cmd = [ssh_keygen(), *args]
    if data is not None:
        io = {"input": data}
    else:       # a passphrase prompt goes to the terminal; never let ssh-keygen read one from a pipe
        io = {"stdin": None if stdin_tty and os.isatty(0) else subprocess.DEVNULL}
    try:
        proc = subprocess.run(cmd, capture_output=True, timeout=timeout, **io)
    except subprocess.TimeoutExpired:
        raise error(f"ssh-keygen {args[0]} {args[1]} did not finish in {timeout:g} s",
                    hint="a key that waits for a passphrase or a touch; or a stuck ssh-agent") from None
    except OSError as exc:
        raise BoardUnavailableError(f"cannot run {cmd[0]}: {exc}", hint=_TOO_OLD_HINT) from None
    stderr = proc.stderr.decode(errors="replace")
    if proc.returncode != 0 and _too_old(stderr):
        raise BoardUnavailableError(f"{cmd[0]} is too old for bundle signatures (it has no ssh-keygen "
                                    f"-Y {args[1]})", hint=_TOO_OLD_HINT)
    return proc


def _reason(proc: subprocess.CompletedProcess) -> str:
    """ssh-keygen's own explanation, one line (its generic closing lines dropped)."""
    generic = ("Could not verify signature.", "No principal matched.", "Signing ", "Write signature to")
    lines = [re.sub(r"^Enter passphrase[^:]*:", "", ln).strip()
             for ln in proc.stderr.decode(errors="replace").splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith(generic)]
    return "; ".join(lines)[:300]


def check_tool() -> str:
    """The path of a usable ``ssh-keygen`` (OpenSSH 8.2+): call it before work that ends with signing, so
    a long compile does not end in "cannot sign".

    Raises:
        BoardUnavailableError: missing or too old (exit 7).
    """
    _run(["-Y", "find-principals"], b"", VERIFY_TIMEOUT_S)      # no arguments: a usage error if supported
    return ssh_keygen()


def sign_bundle(bundle_dir: str | Path, key: str | Path) -> dict:
    """Sign ``bundle_dir``'s ``manifest.json`` with the SSH key ``key``; write ``manifest.json.sig``.

    The bundle is verified against its manifest first (a damaged bundle is never signed). ``key`` is a
    private key file (an encrypted one asks for its passphrase on the terminal), or a public key whose
    private half is in ``ssh-agent``. The signature is made on a copy of the manifest in a temporary
    directory, checked against the bundle's manifest bytes, then renamed into the bundle (replacing an
    older signature).

    Returns:
        ``{"signature": path, "key": "ED25519 SHA256:…", "namespace": "edgehft-bundle",
        "public_key": "ssh-ed25519 AAAA… comment" or None}`` (the public key when ``key`` is one or has a
        ``.pub`` next to it: the line to put in a box's ``allowed_signers``, after a principal).
    Raises:
        InputError: ``key`` missing, not a key ssh-keygen can sign with, or a wrong passphrase (exit 3).
        BundleError: not a bundle, or its files do not match its manifest (exit 6).
        BoardUnavailableError: ssh-keygen missing or too old (exit 7).
    """
    key = Path(key)
    if not key.is_file():
        raise InputError(f"signing key {key} is not a file", hint="pass an SSH private key, e.g. ~/.ssh/id_ed25519")
    b = load_bundle(bundle_dir, verify=True)
    data = (b.path / MANIFEST).read_bytes()
    with tempfile.TemporaryDirectory(prefix="edgehft-sign-") as tmp:
        copy = Path(tmp) / MANIFEST
        copy.write_bytes(data)
        proc = _run(["-Y", "sign", "-f", str(key), "-n", NAMESPACE, str(copy)], None, SIGN_TIMEOUT_S,
                    error=InputError, stdin_tty=True)
        sig = Path(tmp) / SIGNATURE
        if proc.returncode != 0 or not sig.is_file():
            raise InputError(f"ssh-keygen could not sign with {key}: {_reason(proc) or 'no signature written'}",
                             hint="pass an SSH private key (ssh-keygen -t ed25519 makes one); an encrypted "
                                  "key needs its passphrase typed, or the key loaded in ssh-agent")
        armored = sig.read_bytes()
    fingerprint = _check_signature(armored, data)
    if (b.path / MANIFEST).read_bytes() != data:
        raise BundleError(f"{b.path / MANIFEST} changed while it was being signed", hint="sign it again")
    tmp_sig = b.path / f".{SIGNATURE}.{os.getpid()}"
    try:
        tmp_sig.write_bytes(armored)
        os.replace(tmp_sig, b.path / SIGNATURE)
    finally:
        if tmp_sig.exists():
            tmp_sig.unlink()
    pub = key if key.suffix == ".pub" else key.with_name(key.name + ".pub")
    return {"signature": str(b.path / SIGNATURE), "key": fingerprint, "namespace": NAMESPACE,
            "public_key": pub.read_text().strip() if pub.is_file() else None}


def _check_signature(armored: bytes, data: bytes) -> str:
    """``-Y check-novalidate`` (signature over ``data`` in our namespace, no trust): the key fingerprint."""
    with tempfile.TemporaryDirectory(prefix="edgehft-sign-") as tmp:
        sig = Path(tmp) / SIGNATURE
        sig.write_bytes(armored)
        proc = _run(["-Y", "check-novalidate", "-n", NAMESPACE, "-s", str(sig)], data, VERIFY_TIMEOUT_S)
    m = _GOOD.search(proc.stdout.decode(errors="replace"))
    if proc.returncode != 0 or m is None:
        raise SignatureError(f"ssh-keygen made a signature that does not check: {_reason(proc)}")
    return f"{m.group(1)} {m.group(2)}"


def _signature_file(bundle: Path, allowed: Path) -> Path:
    sig = bundle / SIGNATURE
    if not os.path.lexists(sig):
        raise SignatureError(f"bundle {bundle} is not signed (no {SIGNATURE}); {allowed} requires a signature "
                             "by a key it lists", hint=f"sign it: edgehft sign {bundle} --key YOUR_KEY")
    if sig.is_symlink() or not sig.is_file():
        raise SignatureError(f"{sig} is not a regular file", hint="sign the bundle again (edgehft sign)")
    if sig.stat().st_size > MAX_SIGNATURE_BYTES:
        raise SignatureError(f"{sig} is {sig.stat().st_size:,} bytes, not an SSH signature (at most "
                             f"{MAX_SIGNATURE_BYTES:,})", hint="sign the bundle again (edgehft sign)")
    return sig


def verify_bundle(bundle_dir: str | Path, allowed_signers: str | Path) -> dict:
    """Check ``bundle_dir``'s ``manifest.json.sig`` against ``allowed_signers`` (before anything parses the
    manifest). Does not check the other files' hashes: :func:`~edgehft.bundle.load_bundle` does.

    Returns:
        ``{"principal": "alice@desk", "key": "ED25519 SHA256:…", "allowed_signers": path}``.
    Raises:
        InputError: ``allowed_signers`` is not a readable file (exit 3).
        SignatureError: no signature, a damaged one, a key not listed (or expired, or not allowed the
            ``edgehft-bundle`` namespace), a revoked key, or a manifest changed after signing (exit 6).
        BoardUnavailableError: ssh-keygen missing or too old (exit 7).
    """
    bundle, allowed = Path(bundle_dir), Path(allowed_signers)
    if not allowed.is_file() or not os.access(allowed, os.R_OK):
        raise InputError(f"allowed_signers file {allowed} is not a readable file",
                         hint="one line per trusted key: 'principal namespaces=\"edgehft-bundle\" ssh-ed25519 AAAA…'")
    sig = _signature_file(bundle, allowed)
    try:
        data = (bundle / MANIFEST).read_bytes()
    except OSError as exc:
        raise SignatureError(f"bundle {bundle}: cannot read {MANIFEST} ({exc.strerror})") from None
    found = _run(["-Y", "find-principals", "-s", str(sig), "-f", str(allowed)], None, VERIFY_TIMEOUT_S)
    principals = [p for p in found.stdout.decode(errors="replace").splitlines() if p.strip()]
    if found.returncode != 0 or not principals:
        why = _reason(found)
        raise SignatureError(f"bundle {bundle} is signed by {_signer(sig, data)}, which {allowed} does not trust"
                             + (f" ({why})" if why else ""),
                             hint="sign it with a key listed there, or add the signer's public key to it")
    revoked = allowed.with_name(REVOKED)
    revoke = ["-r", str(revoked)] if revoked.is_file() else []
    last = None
    for principal in principals[:16]:
        last = _verify_as(sig, allowed, principal, data, revoke)
        if last.returncode == 0:
            m = _GOOD.search(last.stdout.decode(errors="replace"))
            return {"principal": principal, "key": f"{m.group(1)} {m.group(2)}" if m else "",
                    "allowed_signers": str(allowed)}
    raise SignatureError(f"bundle {bundle}: the signature by {', '.join(principals[:3])} does not verify: "
                         + _why_not(last, sig, allowed, principals[0], data, revoke),
                         hint="compile or sign the bundle again with a trusted key; do not edit a signed bundle")


def _signer(sig: Path, data: bytes) -> str:
    """The signing key's fingerprint, for messages ("a key" when the signature does not even check)."""
    try:
        return "key " + _check_signature(sig.read_bytes(), data)
    except EdgeHFTError:
        return "a key"


def _verify_as(sig: Path, allowed: Path, principal: str, data: bytes, revoke: list[str]):
    return _run(["-Y", "verify", "-f", str(allowed), "-I", principal, "-n", NAMESPACE, "-s", str(sig), *revoke],
                data, VERIFY_TIMEOUT_S)


def _why_not(proc, sig: Path, allowed: Path, principal: str, data: bytes, revoke: list[str]) -> str:
    """Why ``-Y verify`` said no, in words: ssh-keygen says little (nothing at all for a revoked key)."""
    why = _reason(proc)
    if "incorrect signature" in why:
        return f"{MANIFEST} changed after it was signed"
    if "namespace" in why:
        return f"{why} (bundle signatures use namespace {NAMESPACE})"
    if revoke and _verify_as(sig, allowed, principal, data, []).returncode == 0:
        return f"the key is revoked in {revoke[1]}"
    return why or "ssh-keygen -Y verify refused it"


def default_allowed_signers(bundle_dir: str | Path) -> Path:
    """``<install_dir>/allowed_signers`` for a bundle inside a box's install dir (``current``,
    ``versions/<vid>`` or ``incoming/<vid>``; symlinks resolved).

    Raises:
        InputError: the bundle is not inside an install dir, so there is no default (exit 3).
    """
    real = Path(bundle_dir).resolve()
    if real.parent.name in ("versions", "incoming"):
        return real.parent.parent / ALLOWED_SIGNERS
    raise InputError(f"bundle {bundle_dir} is not in an install dir (<dir>/versions/<version>), so there is no "
                     "default allowed_signers file", hint="pass the allowed_signers file's path instead of True")


def require_signature(bundle_dir: str | Path, allowed_signers: str | Path | bool) -> dict:
    """:func:`verify_bundle` against ``allowed_signers``, or with ``True`` against
    :func:`default_allowed_signers` (which must exist).

    Raises:
        InputError, SignatureError, BoardUnavailableError: as :func:`verify_bundle`.
    """
    allowed = default_allowed_signers(bundle_dir) if allowed_signers is True else Path(allowed_signers)
    return verify_bundle(bundle_dir, allowed)


def check_install_dir(bundle_dir: str | Path, install_dir: str | Path, what: str = "verification failed on the box") -> dict | None:
    """Box side: when ``<install_dir>/allowed_signers`` exists (even as a dangling link: fail closed), the
    bundle must carry a good signature by a principal it lists.

    Returns:
        None when the box has no ``allowed_signers`` (signatures not required), else :func:`verify_bundle`'s
        result.
    Raises:
        DeployError: unsigned, foreign, expired, revoked or non-verifying signature, unreadable
            ``allowed_signers``, or ssh-keygen missing or too old on the box (exit 9), each message
            starting with ``what``.
    """
    allowed = Path(install_dir) / ALLOWED_SIGNERS
    if not os.path.lexists(allowed):
        return None
    try:
        return verify_bundle(bundle_dir, allowed)
    except SignatureError as exc:
        raise DeployError(f"{what}: {exc.args[0]}",
                          hint=f"sign the bundle where it was built with a key {allowed} lists (edgehft sign "
                               "BUNDLE --key KEY, or compile --sign KEY); the box keeps its current version") from None
    except EdgeHFTError as exc:
        raise DeployError(f"{what}: {exc.args[0]}", hint=exc.hint) from None
