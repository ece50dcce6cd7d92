"""``fedlatent site``: what a site operator runs at the site (check a policy, read the ledger)."""

from __future__ import annotations

from pathlib import Path

import typer

from .common import CommandGroup

__all__ = ["site_app"]

site_app = typer.Typer(
    cls=CommandGroup,
    no_args_is_help=True,
    help="A site's own policy and privacy ledger (for site operators).",
)


@site_app.command("check")
def check(policy: Path = typer.Argument(..., help="The site policy file (TOML).")):
    """Validate a site policy file and print the floors it sets (errors name the key): the
    files it names exist, the models it answers are known, lifetime budgets are pairs at
    least the per-fit ceilings, no floor is below the library's defaults."""
    from ..engine.contract.registry import estimator_names
    from ..engine.site.policy import SitePolicy
    from ..engine.site.report import format_table

    pol = SitePolicy.load(policy)
    errors, warns = pol.problems(known_models=estimator_names())
    for text in warns:
        typer.echo(f"warning: {text}", err=True)
    if errors:
        for text in errors:
            typer.echo(f"error: site policy {policy}: {text}", err=True)
        raise typer.Exit(2)
    typer.echo(f"{policy}: a valid site policy")
    typer.echo(format_table(("key", "value"), pol.describe(), width=90))
    if not pol.privacy_required:
        typer.echo(TRUSTS_SERVER)


#: what ``site check`` says of a policy that requires neither DP nor verified rounds
TRUSTS_SERVER = (
    "note: this policy requires neither differential privacy nor verified secure aggregation, "
    "so a fit with neither trusts the server with this site's records: a server that crafts "
    "the parameters it sends can rebuild them from the replies. Under secure aggregation this "
    "site verifies every round (it checks its reply is in the sum and replays the server's "
    "step) unless the fit turns verification off. Require one of them with [privacy] "
    "required = true, or \"dp-or-verified\".")


@site_app.command("settings")
def settings(policies: list[Path] = typer.Argument(..., help="The sites' policy files.")):
    """List what each site announces at setup (its floors; DataSHIELD's
    ds.listDisclosureSettings) and the disclosure floor a fit adopts from them all."""
    import json

    from ..engine.privacy.disclosure import DisclosurePolicy
    from ..engine.protocol.settings import adopt_floors, settings_rows
    from ..engine.site.announce import announce
    from ..engine.site.policy import SitePolicy
    from ..engine.site.report import format_table

    got = {}
    for path in policies:
        pol = SitePolicy.load(path)
        name = pol.name or path.stem
        got[name] = json.loads(announce(pol, name)["settings"])
    typer.echo(format_table(("site", "setting", "value"), settings_rows(got), width=70))
    _, record = adopt_floors(DisclosurePolicy(), got)
    raised = record.get("raised", {})
    adopted = record.get("disclosure", {})
    typer.echo("a fit adopts: " + ("the library's default disclosure floor" if not raised else
               "; ".join(f"{k}={adopted[k]} (asked by {', '.join(v)})"
                         for k, v in raised.items())))


@site_app.command("ledger")
def ledger(
    directory: Path = typer.Argument(..., help="The site directory (or ledger file)."),
    full: bool = typer.Option(False, "--full", help="Every cell whole (a refusal's reason and "
                                                    "fix are otherwise cut at 110 characters)."),
):
    """Print the site's ledger as a table, its hash chain verified."""
    from ..engine.site.report import LEDGER_COLUMNS, format_table, ledger_entries, ledger_rows

    entries = ledger_entries(directory)
    rows = ledger_rows(entries)
    width = max([110, *(len(c) for r in rows for c in r)]) if full else 110
    typer.echo(format_table(LEDGER_COLUMNS, rows, width=width))
    typer.echo(f"{len(entries)} entries; hash chain verified")


@site_app.command("report")
def report(directory: Path = typer.Argument(..., help="The site directory (or ledger file).")):
    """Summarize what left the site, per run: exchanges, releases, refusals and their rules."""
    from ..engine.site.report import (
        REPORT_COLUMNS,
        backup_note,
        format_table,
        ledger_entries,
        lifetime_rows,
        report_rows,
        trust_note,
    )

    entries = ledger_entries(directory)
    typer.echo(format_table(REPORT_COLUMNS, report_rows(entries), width=70))
    note = trust_note(entries)
    if note:
        typer.echo(note)
    life = lifetime_rows(entries)
    if life:
        typer.echo("")
        typer.echo(format_table(("data set", "releases", "lifetime epsilon"), life))
    typer.echo("")
    typer.echo(backup_note(directory))


def _register_keys() -> None:
    from .site_keys import register
    from .site_try import TryGroup

    register(site_app)
    site_app.add_typer(typer.Typer(cls=TryGroup, no_args_is_help=True, help=(
        "A dry run of a fit against this site's policy, on its own data, before any server "
        "asks (one command per registered model).")), name="try")


_register_keys()  # ``site keygen``, ``site roster`` and ``site try``
