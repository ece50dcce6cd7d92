"""``fedlatent demo``: the command; what it runs is :func:`fedlatent.demo.run_demo`."""

from __future__ import annotations

from pathlib import Path

import typer

from .common import ProgressOpt, SeedOpt

__all__ = ["demo"]


def demo(
    *,
    out: Path = typer.Option(Path("demo-output"), "--out", help="Where to write the plot."),
    seed: SeedOpt = 0,
    progress: ProgressOpt = None,
):
    """Fit a heterogeneous federated mixture, compare with centralized EM, write a plot."""
    from ..demo import run_demo

    typer.echo(run_demo(out, seed=seed, progress=progress))
