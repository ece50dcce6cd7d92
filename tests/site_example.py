"""The shipped example site policy (``examples/site-policy.toml``) copied as site operators do:
one copy per site, with every file it names made (the data set, the site's signing key, the
consortium's roster when it pins one)."""

from __future__ import annotations

from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "site-policy.toml"


def example_sites(root: Path, sites: list[str]) -> dict[str, Path]:
    """``{site: its policy file}``: the example copied into ``root/<site>/`` for each site,
    each with its own signing key, the roster of every site's key where the example names one,
    and an (empty) file for each data set it names."""
    from fedlatent.engine.site import SitePolicy
    from fedlatent.engine.site.keys import Roster, SiteKeys

    keys = {s: SiteKeys.generate() for s in sites}
    roster = Roster({s: k.public_key for s, k in keys.items()})
    out = {}
    for s in sites:
        f = root / s / "site-policy.toml"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(EXAMPLE.read_text())
        p = SitePolicy.load(f)
        if p.signing_key is not None:
            keys[s].save(p.signing_key)
        if p.roster is not None:
            p.roster.write_text(roster.to_json())
        for path in p.datasets.values():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"")
        out[s] = f
    return out
