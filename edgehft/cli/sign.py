"""``edgehft sign``: sign an existing bundle's manifest with an SSH key (see :mod:`edgehft.signing`)."""
from __future__ import annotations

import json

import click
from rich.markup import escape

from edgehft.cli.common import err, handles_errors, json_opt, main, out


@main.command("sign")
@click.argument("bundle", type=click.Path(exists=True, file_okay=False))
@click.option("--key", "key", required=True, type=click.Path(exists=True, dir_okay=False),
              help="SSH private key (an encrypted one asks for its passphrase), or a public key whose private "
                   "half is in ssh-agent.")
@json_opt
@handles_errors
def sign_cmd(bundle, key, as_json):
    """Sign BUNDLE's manifest.json with KEY through OpenSSH (ssh-keygen -Y sign, namespace edgehft-bundle),
    writing manifest.json.sig next to it (an older signature is replaced). The manifest holds every other
    file's SHA-256, so the signature covers the bundle. A box with an allowed_signers file in its install dir
    takes only bundles signed by a key listed there.

    Exit codes: 0 signed, 2 usage, 3 KEY is not a key ssh-keygen can sign with (or a wrong passphrase),
    6 not a bundle or its files do not match its manifest, 7 ssh-keygen missing or older than OpenSSH 8.2.

    \b
    Example:
      edgehft sign build/deeplob.cpu --key ~/.ssh/release_ed25519"""
    from edgehft.signing import NAMESPACE, sign_bundle
    res = sign_bundle(bundle, key)
    if as_json:
        click.echo(json.dumps(res))
        return
    out.print(f"signed {escape(res['signature'])} with {res['key']} (namespace {NAMESPACE})", highlight=False,
              soft_wrap=True)
    parts = (res["public_key"] or "").split()
    if len(parts) >= 2:
        kind, b64 = parts[:2]
        err.print("[dim]to trust this key on a box, add a line to INSTALL_DIR/allowed_signers:[/]\n"
                  f'  YOUR_NAME namespaces="{NAMESPACE}" {kind} {b64}', highlight=False, soft_wrap=True)
