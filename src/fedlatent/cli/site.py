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
    """Validate a site policy file and print the floors it sets (errors name the key)."""
    from ..engine.site.policy import SitePolicy
    from ..engine.site.report import format_table

    pol = SitePolicy.load(policy)
    typer.echo(f"{policy}: a valid site policy")
    typer.echo(format_table(("key", "value"), pol.describe(), width=90))


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
        format_table,
        ledger_entries,
        lifetime_rows,
        report_rows,
    )

    entries = ledger_entries(directory)
    typer.echo(format_table(REPORT_COLUMNS, report_rows(entries), width=70))
    life = lifetime_rows(entries)
    if life:
        typer.echo("")
        typer.echo(format_table(("data set", "releases", "lifetime epsilon"), life))


def _register_keys() -> None:
    from .site_keys import register
    from .site_try import TryGroup

    register(site_app)
    site_app.add_typer(typer.Typer(cls=TryGroup, no_args_is_help=True, help=(
        "A dry run of a fit against this site's policy, on its own data, before any server "
        "asks (one command per registered model).")), name="try")


_register_keys()  # ``site keygen``, ``site roster`` and ``site try``
