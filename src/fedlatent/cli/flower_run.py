"""``fedlatent flower local MODEL``: a whole loopback Flower deployment on this machine.

Partition the data if needed, start a SuperLink and one SuperNode per client on 127.0.0.1 (each
with its site's policy file: ``--site-policy SITE=FILE``), run the fit (a line per round, and
while waiting), collect the model, and stop every process (also on an error or Ctrl-C);
``--resume`` continues a run that stopped from the server's checkpoint and the sites' states
(each site keeps its private state and its ledger in ``<data file stem>.site`` beside its data
file, unless its policy names a ``directory``).

The result is as good as ``fedlatent fit``'s: ``OUT/result`` holds the model, ``history.csv``
and ``roles.json`` (so ``fedlatent predict --model OUT/result`` knows the columns), the summary
and the fit's warnings are printed; a fit the sites refused prints one line per site with its
fix, and where each site's ledger is (``fedlatent site ledger DIR`` reads it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer

from .common import fail, load_dataset
from .fit import EXCLUDED_FILE, ROLES_FILE, ModelGroup, roles_of, write_clients
from .flower import (
    _client_dir_files,
    _require_flower,
    _run_config,
    _split_rows,
    deployment_rows,
    estimator_of,
    model_rows,
)

__all__ = ["LocalGroup", "local_app", "local_command"]


class LocalGroup(ModelGroup):
    """``flower local MODEL``: a command per registered model."""

    @staticmethod
    def make(entry):
        return local_command(entry)


#: ``fedlatent flower local`` (added to the ``flower`` group by :mod:`fedlatent.cli`)
local_app = typer.Typer(cls=LocalGroup, no_args_is_help=True,
                        help="Fit on a loopback Flower deployment on this machine (one command "
                             "per registered model).")


def local_command(entry):
    """``fedlatent flower local NAME``: the data's options, the deployment's, the model's."""
    from .options import Row, build_command, data_rows

    rows = [*data_rows(entry, columns_required=False, data_help=(
                "A table file (with --client, or --split-rows N to split its rows) or a "
                "directory of client files from 'fedlatent flower partition'.")),
            Row("split_rows", ("--split-rows",), "Split the rows of a table file without a client "
                "column into N random clients (shuffled by --seed).", kind="int", metavar="N"),
            Row("clients", ("--clients",), "Deprecated: --split-rows N.", kind="int",
                hidden=True),
            Row("site_policy", ("--site-policy",), "SITE=FILE: the policy file (TOML) of site "
                "SITE (a client id), its SuperNode's policy-path; FILE alone: every site not "
                "named. Repeat for several sites.", kind="list", metavar="SITE=FILE"),
            Row("min_nodes", ("--min-nodes",), "SuperNodes the server waits for [default: "
                "every client].", kind="int", metavar="N"),
            *deployment_rows(),
            Row("timeout", ("--timeout",), "Seconds for the whole run. [default: 3600]",
                kind="float", metavar="SECONDS"),
            Row("resume", ("--resume/--no-resume",), "Continue the run that stopped in --out "
                "from the server's checkpoint and the sites' states (same model, parameters "
                "and data). [default: off]", kind="flag"),
            Row("out", ("--out",), "Output: result/ (model, history, roles.json), deploy/ "
                "(logs), data/ (the client files and the sites' directories).", kind="path",
                required=True, metavar="DIR"),
            *model_rows(entry)]
    return build_command(entry.name, rows, lambda values: _local(entry, values),
                         help=f"Fit {entry.cls.__name__} on a loopback Flower deployment: "
                              "partition if needed, start a SuperLink and a SuperNode per "
                              "client, fit, collect, stop it all.",
                         short_help=entry.description)


@dataclass
class Sites:
    """The client files of a local deployment and what the result's summary needs."""

    files: list[Path]
    ids: list[str]
    n_samples: int
    n_features: int
    roles: dict[str, Any]
    encoding: Any = None
    policies: list[Path | None] = field(default_factory=list)
    ledgers: dict[str, Path] = field(default_factory=dict)


def _local(entry, values: dict[str, Any]) -> None:
    _require_flower()
    typer.echo("note: flower local runs on 127.0.0.1 without TLS or SuperNode authentication "
               "(loopback only); for a deployment across machines use 'flower partition'",
               err=True)
    from ..runtime.flower_local import write_app

    est = estimator_of(entry, values)
    out = values["out"].resolve()
    resume = bool(values["resume"])
    if resume and not (out / "result" / "checkpoint.npz").exists():
        fail(f"--resume: there is no checkpoint {out / 'result' / 'checkpoint.npz'} to resume "
             "from; run without --resume")
    sites = _sites(entry, values, out / "data")
    _attach_policies(sites, values.get("site_policy"))
    n_min = len(sites.files) if values["min_nodes"] is None else values["min_nodes"]
    config = _run_config(est, result_dir=out / "result", min_nodes=n_min,
                         round_timeout=values["round_timeout"] or 120.0,
                         node_wait=values["node_wait"] or 120.0, resume=resume)
    result = _deploy_and_run(sites, write_app(out / "app", config), out / "deploy",
                             values["timeout"] or 3600.0)
    _finish(entry, result, sites)


# ---- the sites --------------------------------------------------------------------------------
def _sites(entry, values: dict[str, Any], data_dir: Path) -> Sites:
    """The client files of ``flower local``: ``--data``'s own when it is a directory of client
    files, else the table split by ``--client`` (or into ``--split-rows`` random parts) and written
    into ``data_dir``; exits with an error line when the options disagree."""
    from ..data.files import read_client_file, write_client_files

    data, split = values["data"], values["split_rows"]
    if values.get("clients") is not None:
        from .vocabulary import deprecated

        deprecated("--clients", "--split-rows N")
        split = split if split is not None or data.is_dir() else values["clients"]
    if data.is_dir():
        files = _client_dir_files(data)
        if values.get("clients") is not None and values["clients"] != len(files):
            fail(f"--clients {values['clients']} but the data hold {len(files)} clients")
        parts = [read_client_file(f) for f in files]
        return Sites(files, [p.client_ids[0] for p in parts], sum(p.n_samples for p in parts),
                     parts[0].n_features, {**roles_of(entry.name, None, parts[0].target_name,
                                                      parts[0].entity_name),
                                           "features": [str(f) for f in parts[0].feature_names]})
    fd = _table_dataset(entry, values, split)
    paths = write_client_files(fd, data_dir)
    roles = roles_of(entry.name, values["client"], values.get("target") or fd.target_name,
                     values.get("entity"))
    return Sites([paths[c] for c in fd.client_ids], list(fd.client_ids), fd.n_samples,
                 fd.n_features, {**roles, "features": [str(f) for f in fd.feature_names]},
                 getattr(fd, "encoding", None))


def _table_dataset(entry, values: dict[str, Any], split: int | None):
    from .options import needed_columns

    if values["client"] is not None:
        needed_columns(entry, values, "flower local")
        _, fd = load_dataset(values["data"], values["client"], values["features"],
                             target=values.get("target"), entity=values.get("entity"),
                             categorical=values.get("categorical"),
                             categorical_columns=values.get("categorical_columns"),
                             weight=values.get("weight"), formula=values.get("formula"))
        return fd
    if split is None:
        fail("give --client COLUMN (or --split-rows N to split the rows) for a table file")
    if values.get("entity") is not None:
        fail("--entity needs --client: entities cannot be split across random clients")
    seed = values.get("random_state")
    return _split_rows(values["data"], split, values["features"], values.get("target"),
                       0 if seed is None else seed)


def _attach_policies(sites: Sites, items: list[str] | None) -> None:
    """``--site-policy SITE=FILE`` (or ``FILE`` for every site not named) as one policy file
    per client file, each checked now (errors name the file and the key); the ledger directory
    of each site with a policy."""
    from ..data.validation import name_list
    from ..engine.site.policy import SitePolicy
    from ..runtime.flower_site import site_dir

    named: dict[str, Path] = {}
    every: Path | None = None
    for item in items or []:
        site, sep, path = item.rpartition("=")
        if not sep:
            every = Path(path)
            continue
        if site not in sites.ids:
            fail(f"--site-policy {item}: there is no site {site!r}; the sites: "
                 f"{name_list(sites.ids)}")
        named[site] = Path(path)
    sites.policies = [named.get(c, every) for c in sites.ids]
    for cid, path, data in zip(sites.ids, sites.policies, sites.files):
        if path is None:
            continue
        policy = SitePolicy.load(path)  # a bad file stops here, before any process starts
        where = policy.directory if policy.directory is not None else site_dir({}, data)
        sites.ledgers[cid] = Path(where)


# ---- the run ----------------------------------------------------------------------------------
def _print_round(status: dict) -> None:
    last = status.get("last") or {}
    missing = last.get("missing") or []
    typer.echo(f"round {status.get('round')}: objective {last.get('objective', float('nan')):.6g}"
               f", {last.get('participants', '?')} clients answered"
               + (f" (missing {', '.join(map(str, missing))})" if missing else "")
               + (f", {last['seconds']:.1f} s" if "seconds" in last else ""))


class _Beat:
    """After :meth:`start`, a line every ``every`` seconds until the ``with`` block ends (a
    step whose end nobody reports, such as stopping the deployment's processes)."""

    def __init__(self, every: float = 5.0) -> None:
        import threading

        self.every, self._done, self._thread = every, threading.Event(), None

    def start(self, text: str) -> None:
        import threading
        import time

        t0 = time.monotonic()

        def beat() -> None:
            while not self._done.wait(self.every):
                typer.echo(f"... {time.monotonic() - t0:.0f} s: {text}")

        self._thread = threading.Thread(target=beat, daemon=True)
        self._thread.start()

    def __enter__(self) -> _Beat:
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()


def _print_wait(status: dict | None, seconds: float) -> None:
    """A line while no round ends: what the server is doing (initialization exchanges)."""
    status = status or {}
    done = int(status.get("round") or 0)
    if done:
        what = f"round {done + 1} running"
    elif status.get("exchanges"):
        what = (f"initialization: {status['exchanges']} exchanges with the clients done "
                f"(last: {status.get('exchange')})")
    else:
        what = "waiting for the server app to start and the clients to answer"
    typer.echo(f"... {seconds:.0f} s: {what}")


def _deploy_and_run(sites: Sites, app_dir: Path, workdir: Path, timeout: float) -> Path:
    """Start a loopback deployment of the sites' files (each with its policy) in ``workdir``,
    run the app with a line per round (and while waiting), stop every process (also on Ctrl-C
    or SIGTERM: exit 130); return the server's result directory."""
    import signal

    from ..runtime.flower_local import LocalDeployment, run_app

    def on_sigterm(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    files = sites.files
    typer.echo(f"starting a SuperLink and {len(files)} SuperNodes on 127.0.0.1 "
               f"(logs in {workdir})")
    try:
        with _Beat() as beat, LocalDeployment(files, workdir=workdir,
                                                     policy_paths=sites.policies) as dep:
            typer.echo(f"deployment ready in {dep.startup_seconds:.1f} s "
                       f"(SuperLink {dep.address}, PIDs {dep.pids})")
            result = run_app(app_dir, dep, timeout=timeout, on_round=_print_round,
                             on_wait=_print_wait)
            typer.echo(f"run finished in {dep.last_run_seconds:.1f} s; stopping every Flower "
                       "process")
            beat.start("stopping every Flower process")  # until the deployment has stopped
    except KeyboardInterrupt:
        typer.echo("interrupted: every Flower process stopped", err=True)
        raise typer.Exit(130) from None
    except RuntimeError as e:
        _refused(app_dir.parent / "result", sites, e)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return result


def _refused(result: Path, sites: Sites, err: RuntimeError) -> None:
    """A failed run's error lines: with the clients' reasons (status.json), one line per
    client in the command line's words and where each site's ledger is; exits."""
    from .common import one_line
    from .errors import fault_lines

    try:
        status = json.loads((result / "status.json").read_text())
    except (OSError, ValueError):
        status = {}
    faults = status.get("faults") or {}
    if not faults:
        fail(str(err), code=1)
    message = str(status.get("error") or "").partition(": ")[2] or str(err)
    head, *rest = fault_lines(one_line(message), faults)
    typer.echo(f"error: {head}", err=True)
    for line in rest:
        typer.echo(line, err=True)
    for cid, ledger in sites.ledgers.items():
        typer.echo(f"site {cid!r}: its ledger is {ledger} (fedlatent site ledger {ledger})",
                   err=True)
    typer.echo(f"the deployment's logs: {result.parent / 'deploy'}", err=True)
    raise typer.Exit(2)


def _finish(entry, result: Path, sites: Sites) -> None:
    """The last lines of ``flower local``: the fit's warnings and summary as ``fit`` prints
    them, rounds and seconds per round, lost clients, the files (``roles.json`` written)."""
    from ..runtime.flower import load_result
    from .common import write_atomic
    from .errors import cli_words
    from .fit_models import summary

    status = json.loads((result / "status.json").read_text())
    for w in status.get("warnings") or []:
        name = "" if w["category"] == "UserWarning" else f"{w['category']}: "
        typer.echo(f"warning: {name}{cli_words(' '.join(w['message'].split()))}", err=True)
    est = load_result(result)
    roles = dict(sites.roles)
    if sites.encoding is not None:
        roles["categorical"] = sites.encoding.to_json()
    write_atomic(result / ROLES_FILE,
                 lambda tmp: Path(tmp).write_text(json.dumps(roles, indent=1) + "\n"))
    written = [ROLES_FILE]
    if getattr(est, "excluded_clients_", None):  # sites left out of the fit, as fit writes
        write_atomic(result / EXCLUDED_FILE,
                     lambda tmp: write_clients(Path(tmp), est.excluded_clients_))
        written.append(EXCLUDED_FILE)
    typer.echo(f"every Flower process stopped; {status.get('rounds')} rounds"
               + (f", {status['seconds_per_round']:.1f} s per round"
                  if status.get("seconds_per_round") else ""))
    for line in summary(entry.name, est, len(sites.ids), sites.n_samples, sites.n_features):
        typer.echo(line)
    if status.get("lost"):
        typer.echo(f"clients lost on the way: {status['lost']}")
    typer.echo(f"wrote {result} (model.npz/json, history.csv, {', '.join(written)}, "
               "status.json)")
