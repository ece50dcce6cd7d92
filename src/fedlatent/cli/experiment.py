"""``fedlatent experiment NAME [--quick] --out DIR``: the paper reproductions of
:mod:`fedlatent.experiments`, one subcommand each, listed with their descriptions by
``fedlatent experiment --help``. The list is :func:`fedlatent.experiments.available`: adding a
module to that package adds its experiments here."""

from __future__ import annotations

from pathlib import Path

import typer
from typer.core import TyperCommand

from .common import CommandGroup, ProgressOpt, SeedOpt, progress_lines

__all__ = ["experiment_app"]

#: rows of an experiment's table printed (the CSV has them all)
SHORT_ROWS = 20


def _files(out: Path) -> dict[Path, int]:
    """Every file under ``out`` with its modification time (ns)."""
    if not out.is_dir():
        return {}
    return {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}


def _written(out: Path, before: dict[Path, int]) -> list[Path]:
    """The files under ``out`` that are new or changed since ``before``, sorted."""
    return sorted(p for p, t in _files(out).items() if before.get(p) != t)


class ExperimentGroup(CommandGroup):
    """One command per experiment, built when asked for (listing imports no experiment). The
    commands are the experiments' names with hyphens, as options are spelled
    (``fedem-toy``); the Python name (``fedem_toy``) works too."""

    what = "experiment"

    def list_commands(self, ctx: typer.Context) -> list[str]:
        from .. import experiments

        return [name.replace("_", "-") for name in experiments.available()]

    def get_command(self, ctx: typer.Context, name: str) -> TyperCommand | None:
        from .. import experiments

        spelled = name.replace("_", "-")
        cmd = super().get_command(ctx, spelled)
        description = experiments.available().get(spelled.replace("-", "_"))
        if cmd is None and description is not None:
            cmd = _command(spelled.replace("-", "_"), description, spelled)
            self.add_command(cmd, spelled)
            cmd = super().get_command(ctx, spelled)
        return cmd


experiment_app = typer.Typer(
    cls=ExperimentGroup, no_args_is_help=True,
    help="Run a paper reproduction: print its table, write it as CSV and its plots to --out.",
)


def _command(name: str, description: str, spelled: str) -> TyperCommand:
    """The command ``spelled`` running ``fedlatent.experiments.<name>``."""
    sub = typer.Typer(add_completion=False)

    @sub.command(spelled, help=f"{description}\n\nfedlatent.experiments.{name}(quick, out, "
                            "random_state): prints the table's first rows, writes NAME.csv "
                            "and plots to --out and names every file written.",
                 short_help=description)
    def run(
        *,
        quick: bool = typer.Option(False, "--quick", help="The small size used in tests."),
        out: Path = typer.Option(Path("experiment-output"), "--out",
                                 help="Directory for NAME.csv and the plots."),
        seed: SeedOpt = 0,
        progress: ProgressOpt = None,
    ):
        import logging

        with progress_lines(None if progress is None else progress):
            # a line as soon as the command runs: the imports and the first step take seconds
            logging.getLogger("fedlatent").info("experiment %s: starting%s", name,
                                                " (quick)" if quick else "")
            import pandas as pd

            from .. import experiments

            before = _files(out)
            table = getattr(experiments, name)(quick=quick, out=out, random_state=seed)
        out.mkdir(parents=True, exist_ok=True)
        table.to_csv(out / f"{name}.csv", index=False)
        with pd.option_context("display.width", 160, "display.max_columns", 12):
            typer.echo(table.head(SHORT_ROWS).to_string(index=False))
        if len(table) > SHORT_ROWS:
            typer.echo(f"... {len(table) - SHORT_ROWS} more rows: the full table is "
                       f"{out / (name + '.csv')}")
        for path in _written(out, before):  # every file the run wrote, named
            typer.echo(f"wrote {path}")

    return typer.main.get_command(sub)
