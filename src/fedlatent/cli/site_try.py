"""``fedlatent site try MODEL --policy FILE --data FILE``: a dry run of a fit against this
site's policy, on its own data, before any server asks.

The fit runs in this process (:class:`~fedlatent.engine.transport.inprocess.InProcessRuntime`)
with the site's node holding the policy, exactly as a deployment's node would; the options are
the model's table (:mod:`fedlatent.cli.options`: what a server could ask for). Without
``--client`` every row of the file is the site's (one client, named as the policy names the
site); with it, every client of the file holds the policy. The policy's ledger is copied into a
temporary directory first, so the lifetime budget counts what the site already released while
the site's own ledger stays untouched. It prints whether the site would answer, its refusal with
the fix in the command line's words otherwise, and the ledger entries the run would have written.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import typer

from .common import fail
from .fit import ModelGroup

__all__ = ["TryGroup", "try_command"]


class TryGroup(ModelGroup):
    """``site try MODEL``: a command per registered model."""

    @staticmethod
    def make(entry):
        return try_command(entry)


def try_command(entry):
    """``fedlatent site try NAME``: the policy, the site's data, the model's options."""
    from .flower import model_rows
    from .options import Row, build_command, data_rows

    rows = [Row("policy", ("--policy",), "The site policy file (TOML) to try.", kind="path",
                required=True, metavar="FILE"),
            *data_rows(entry, columns_required=False, data_help=(
                "The site's data, a CSV or Parquet file (every row the site's unless --client "
                "names a client column).")),
            *model_rows(entry)]
    return build_command(entry.name, rows, lambda values: _try(entry, values),
                         help=f"A dry run of a {entry.cls.__name__} fit against the site's "
                              "policy: would the site answer, and what would it write to its "
                              "ledger? The site's ledger is not touched.",
                         short_help=entry.description)


def _site_data(values: dict[str, Any], site: str):
    """The site's rows as a federated dataset (one client ``site`` without ``--client``)."""
    from .common import frame_dataset, read_frame

    df, client = read_frame(values["data"]), values["client"]
    if client is None:
        client = "__site__"
        if client in df.columns:
            fail(f"{values['data']} has a column {client!r}; give --client")
        df[client] = site
    return frame_dataset(df, client, values["features"], target=values.get("target"),
                         entity=values.get("entity"), categorical=values.get("categorical"),
                         categorical_columns=values.get("categorical_columns"),
                         weight=values.get("weight"), formula=values.get("formula"))


def _copy_ledger(policy, into: Path) -> int:
    """The site's ledger files copied into ``into``; the number of entries copied."""
    from ..engine.site.ledger import HEAD_FILE, LEDGER_FILE, Ledger

    into.mkdir(parents=True, exist_ok=True)
    if policy.directory is None or not (Path(policy.directory) / LEDGER_FILE).exists():
        return 0
    for name in (LEDGER_FILE, HEAD_FILE):
        if (Path(policy.directory) / name).exists():
            shutil.copy2(Path(policy.directory) / name, into / name)
    return len(Ledger(into, policy.site_name("")).entries)


def _try(entry, values: dict[str, Any]) -> None:
    from ..engine.faults import FederatedFitError
    from ..engine.site.ledger import Ledger
    from ..engine.site.policy import SitePolicy
    from ..engine.site.report import LEDGER_COLUMNS, format_table, ledger_rows
    from ..engine.transport.inprocess import InProcessRuntime
    from .common import one_line
    from .errors import fault_lines
    from .options import needed_columns
    from .vocabulary import build_estimator

    needed_columns(entry, values, "site try")
    policy = SitePolicy.load(values["policy"])
    est = build_estimator(entry, values, values.get("param"))
    fd = _site_data(values, policy.site_name("site"))
    with tempfile.TemporaryDirectory(prefix="fedlatent-try-") as tmp:
        policies, before = {}, {}
        for i, cid in enumerate(fd.client_ids):
            where = Path(tmp) / f"site-{i}"
            before[cid] = _copy_ledger(policy, where)
            policies[cid] = replace(policy, directory=where)
        try:
            est.fit(fd, runtime=InProcessRuntime(fd, policies=policies))
        except FederatedFitError as err:
            faults = err.faults or {}
            lines = fault_lines(one_line(str(err)), faults) if faults else [one_line(str(err))]
            typer.echo(f"the site would refuse this fit: {lines[0]}")
            for line in lines[1:]:
                typer.echo(line)
            refused = True
        else:
            refused = False
            typer.echo(f"the site would answer this fit ({getattr(est, 'n_iter_', '?')} "
                       f"rounds on {fd.n_samples} rows of {fd.n_clients} client(s))")
        for cid, pol in policies.items():
            new = Ledger(pol.directory, pol.site_name(cid)).entries[before[cid]:]
            typer.echo(f"site {pol.site_name(cid)!r}: {len(new)} ledger entries this fit "
                       "would write (the site's ledger is untouched):")
            rows = ledger_rows(new)
            typer.echo(format_table(LEDGER_COLUMNS, rows, width=max(
                [110, *(len(c) for r in rows for c in r)])))
    if refused:
        raise typer.Exit(1)
