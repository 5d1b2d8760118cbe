"""Install a bundle into an install directory on this machine, without SSH: the box-side steps of a deploy
(:class:`edgehft.deploy.store.Store`: receive, verify, activate) called in this process. For a box that is this
machine, and for what drives swaps under a serving process here (the soak across swaps, the swap benchmark).
It runs no golden vectors and no latency gate (``edgehft deploy`` does): the serving process checks a new version
itself before it answers from it (:mod:`edgehft.serving`)."""
from __future__ import annotations

import io
import socket
from pathlib import Path

from edgehft.bundle import MANIFEST, load_bundle, sha256_file


def install_local(root: str | Path, bundle_dir: str | Path, keep: int = 3) -> dict:
    """Stage ``bundle_dir`` under ``root`` (created when missing), verify it and make it the active version
    (``current``; ``previous`` the one before), pruning beyond ``keep`` versions as a deploy does.

    Returns:
        :meth:`Store.activate`'s dict (``active``, ``previous``, ``pruned``, ``warnings``) with ``version``.
    Raises:
        BundleError: ``bundle_dir`` is not a valid bundle; DeployError: what the store refuses (disk full, a
            file that does not verify, a deploy holding the box)."""
    from edgehft.deploy.deploy import tar_bundle, version_id
    from edgehft.deploy.store import Store
    from edgehft.signing import SIGNATURE
    b = load_bundle(bundle_dir, verify=True)
    files = sorted(b.manifest.files) + [MANIFEST] + ([SIGNATURE] if (b.path / SIGNATURE).is_file() else [])
    data = tar_bundle(b.path, files)
    vid = version_id(sha256_file(b.path / MANIFEST))
    store = Store(root)
    meta = {"bundle_sha256": sha256_file(b.path / MANIFEST), "board": b.manifest.board,
            "model_file": b.manifest.model_file, "files": len(files), "bytes": len(data),
            "from_host": socket.gethostname(), "local": True}
    store.receive(vid, io.BytesIO(data), len(data), meta)
    store.verify(vid)
    return {"version": vid, **store.activate(vid, keep=keep)}
