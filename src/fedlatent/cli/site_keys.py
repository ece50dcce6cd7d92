"""``fedlatent site keygen`` and ``fedlatent site roster``: a site's signing key and the
consortium's roster (:mod:`fedlatent.engine.site.keys`).

- ``site keygen DIR --site ID`` writes ``DIR/site-key.pem`` (the Ed25519 private key, readable
  by its owner only; it never leaves the site) and ``DIR/site-key.pub`` (the public key, PEM),
  and prints the roster entry to send to the consortium;
- ``site roster OUT ID=PUBFILE...`` writes the roster file every site pins, from the public keys
  the sites sent, and prints its fingerprint (which operators compare on a call).

:func:`register` adds both commands to the ``fedlatent site`` group.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from .common import fail, user_errors

__all__ = ["keygen", "register", "roster"]


def keygen(
    directory: Annotated[Path, typer.Argument(help="Directory to write site-key.pem and "
                                              "site-key.pub into (created if needed).")],
    site: Annotated[str, typer.Option("--site", help="This site's id: the client id it "
                                      "answers as, under which the roster lists it.")],
) -> None:
    """Create this site's long-term Ed25519 signing key (never overwrites one)."""
    with user_errors():
        from ..engine.site.keys import KEY_FILE, PUBLIC_FILE, SiteKeys

        key_path, pub_path = directory / KEY_FILE, directory / PUBLIC_FILE
        if key_path.exists() or pub_path.exists():
            fail(f"{key_path} or {pub_path} exists already; a site keeps one key (move the old "
                 "one away first if it must be replaced, and tell the consortium)")
        keys = SiteKeys.generate()
        keys.save(key_path)
        pub_path.write_text(keys.public_pem())
        typer.echo(f"wrote {key_path} (private: keep it on this site) and {pub_path}")
        typer.echo("roster entry to send to the consortium:")
        typer.echo(json.dumps({site: keys.public_b64}))


def roster(
    out: Annotated[Path, typer.Argument(help="The roster file to write (JSON).")],
    entries: Annotated[list[str], typer.Argument(help="ID=PUBFILE: a site's id and the "
                                                 "site-key.pub it sent.")],
) -> None:
    """Write the consortium's roster from the sites' public keys and print its fingerprint."""
    with user_errors():
        from ..engine.site.keys import Roster

        keys: dict[str, str] = {}
        for entry in entries:
            site, sep, pub = entry.partition("=")
            if not sep or not site or not pub:
                fail(f"roster entry {entry!r}: expected ID=PUBFILE, e.g. "
                     "hospital_a=keys/hospital_a/site-key.pub")
            if site in keys:
                fail(f"site {site!r} is listed twice")
            keys[site] = Path(pub).read_text()
        r = Roster(keys, where="the roster entries")
        if out.exists():
            fail(f"{out} exists already; write the roster to a new file")
        out.write_text(r.to_json())
        typer.echo(f"wrote {out}: {len(r)} sites, fingerprint {r.fingerprint()}")


def register(app: typer.Typer) -> None:
    """Add ``keygen`` and ``roster`` to the ``fedlatent site`` group ``app``."""
    app.command("keygen")(keygen)
    app.command("roster")(roster)
