"""Cost of secure aggregation per round on Flower (simulation and loopback deployment) against
the plain round, with the in-process round of the same fit beside it (one run).

A federated GMM (d = 4, K = 3, full covariance, ``--rows`` rows per client) with participation
0.7, the quantizer (8 levels) and control variates (the setting of bench_secure_fit.py), fitted
for ``--rounds`` rounds with and without ``Federation(secure_aggregation=True)`` on the same seed,
in-process, on Flower's simulation engine (Ray) and on a loopback deployment (one SuperLink and
one SuperNode process per client). Reported per runtime and number of clients:

- seconds per round as the server measures it (send, client E-steps, reveal, M-step), median of
  rounds 2..end (round 1 is the initialization round and the control variates' start), plain,
  secure, ratio;
- bytes up and down per round as ``history_`` records them (secure: masked uint64 replies plus
  the reveal round trip), median of rounds 2..end, and the ratio of bytes up;
- the key set-up, once per fit (keys, roster, sealed shares: three exchanges with every
  client): its seconds, timed around ``SecureChannel.setup`` inside the server app, and its
  bytes (``history_`` adds them to round 1);
- the largest difference of the secure fit's means to the plain fit's (fixed-point rounding).

A secure round is two exchanges (the masked E-step, then the reveal of the shares that remove
the masks); on a deployment, where Flower starts one ClientApp process per message, that is
twice the processes of a plain round.

    .venv/bin/python benchmarks/bench_secure_flower.py [--clients 5 10] [--deploy-clients 5]
        [--rows 300] [--rounds 5] [--skip-sim] [--skip-deploy]

Needs ``pip install -e ".[flower-sim,privacy]"`` (``[flower,privacy]`` with ``--skip-sim``).
This file is also the deployment's server app: it is copied into the app directory, whose
``*.py`` travel to the SuperLink (``bench_secure_flower:server_app``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

import fedlatent as fl

SETUP_FILE = "secagg-setup.json"


@contextlib.contextmanager
def timing_setup(out: dict):
    """Time every ``SecureChannel.setup`` run inside the block: ``out`` gets its seconds and
    bytes up and down (the channel's own count, what ``history_`` adds to round 1)."""
    from fedlatent.engine.secagg import secure

    setup = secure.SecureChannel.setup

    def timed(channel):
        t0 = time.perf_counter()
        done = setup(channel)
        out.update(seconds=time.perf_counter() - t0, up=channel.setup_up,
                   down=channel.setup_down)
        return done

    secure.SecureChannel.setup = timed
    try:
        yield out
    finally:
        secure.SecureChannel.setup = setup


def make_server_app(config: dict | None = None):
    """fedlatent's server app, with the key set-up timed into ``out-dir/secagg-setup.json``."""
    from flwr.serverapp import ServerApp

    from fedlatent.runtime.flower import run_server

    app = ServerApp()
    fixed = dict(config or {})

    @app.main()
    def main(grid, context) -> None:
        cfg = {**dict(context.run_config), **fixed}
        with timing_setup({}) as setup:
            run_server(grid, cfg)
        (Path(str(cfg["out-dir"])) / SETUP_FILE).write_text(json.dumps(setup))

    return app


try:  # the deployment's component (this file travels in the app directory)
    server_app = make_server_app()
except ImportError:  # pragma: no cover - flwr missing
    server_app = None


# ---- the fits -------------------------------------------------------------------------------
def blobs(n_clients: int, rows: int, seed: int = 0) -> fl.FederatedDataset:
    """bench_secure_fit.py's data (three Gaussian blobs in d = 4) with ``rows`` rows per
    client."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(0, 3, (3, 4))
    return fl.FederatedDataset.from_arrays(
        {f"c{i:03d}": centers[rng.integers(0, 3, rows)] + rng.normal(size=(rows, 4))
         for i in range(n_clients)})


def lines(n_clients: int, rows: int, seed: int = 0) -> fl.FederatedDataset:
    """Two regression lines in x (d = 1) mixed in client-dependent proportions."""
    rng = np.random.default_rng(seed)
    data = {}
    for i in range(n_clients):
        x = rng.uniform(0, 10, size=(rows, 1))
        z = rng.random(rows) < (0.15 + 0.7 * (i % 2))
        data[f"c{i:03d}"] = (x, np.where(z, 5 + 2 * x[:, 0], 15 - x[:, 0])
                             + rng.normal(size=rows))
    return fl.FederatedDataset.from_arrays(data)


#: model -> (its data, its estimator given a federation, the fitted attribute compared)
MODELS = {
    "gmm": (blobs, lambda fed, **kw: fl.FederatedGaussianMixture(
        3, init_params="random", federation=fed, verbose=False, **kw), "means_"),
    "lcr": (lines, lambda fed, **kw: fl.LatentClassRegression(2, federation=fed, **kw), "coef_"),
}


def estimator(model: str, n_clients: int, secure: bool, rounds: int):
    from bench_secure_fit import quorum_seed

    fed = fl.Federation(participation=0.7, quantizer=fl.Quantizer(8), secure_aggregation=secure)
    return MODELS[model][1](fed, max_rounds=rounds, tol=0.0,
                            random_state=quorum_seed(n_clients, rounds))


def inprocess(fd, est):
    setup: dict = {}
    with timing_setup(setup):
        est.fit(fd, runtime=fl.InProcessRuntime(fd, batched=False))
    return est, setup


def simulation(fd, est, work: Path):
    """As ``fedlatent.runtime.flower.simulate``, with the timed server app."""
    from fedlatent.data.files import write_client_files
    from fedlatent.runtime.flower import load_result, make_client_app, run_config_for
    from fedlatent.runtime.flower_engine import run_engine

    files = write_client_files(fd, work / "data")
    config = run_config_for(est, out_dir=work / "out", min_nodes=fd.n_clients,
                            round_timeout=600.0)
    run_engine(make_server_app(config),
               make_client_app([str(files[c]) for c in fd.client_ids]), fd.n_clients,
               {"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                "init_args": {"include_dashboard": False, "log_to_driver": False}})
    return load_result(work / "out"), json.loads((work / "out" / SETUP_FILE).read_text())


def deployment(fd, est, work: Path):
    """One loopback deployment (a SuperLink, one SuperNode per client) for this fit."""
    from fedlatent.data.files import write_client_files
    from fedlatent.runtime.flower import load_result, run_config_for
    from fedlatent.runtime.flower_local import LocalDeployment, run_app, write_app

    paths = write_client_files(fd, work / "data")
    app = write_app(work / "app", run_config_for(est, out_dir=work / "out",
                                                 min_nodes=fd.n_clients, round_timeout=900.0),
                    components={"serverapp": "bench_secure_flower:server_app",
                                "clientapp": "fedlatent.runtime.flower:client_app"})
    shutil.copy(__file__, app / "bench_secure_flower.py")
    with LocalDeployment([paths[c] for c in fd.client_ids], workdir=work / "deploy") as dep:
        run_app(app, dep, timeout=3600)
    return load_result(work / "out"), json.loads((work / "out" / SETUP_FILE).read_text())


# ---- the table ------------------------------------------------------------------------------
def per_round(est) -> dict:
    """Medians of rounds 2..end (seconds, bytes up and down, clients) and round 1's seconds."""
    h = est.history_.to_frame()
    if any(len(m) for m in h["missing"]):
        raise RuntimeError(f"clients went missing (a dropout changes the rounds): "
                           f"{h['missing'].tolist()}")
    later = h.iloc[1:]
    return {"s": float(later["seconds"].median()), "up": float(later["bytes_up"].median()),
            "down": float(later["bytes_down"].median()), "s1": float(h["seconds"].iloc[0]),
            "active": float(later["participants"].median())}


def rows(key, plain, secure, setup: dict, attr: str) -> tuple[str, str]:
    """One line of the seconds table and one of the bytes table."""
    p, s = per_round(plain), per_round(secure)
    diff = float(np.max(np.abs(getattr(plain, attr) - getattr(secure, attr))))
    head = f"{key[0]:<6}{key[1]:<12}{key[2]:>4}{s['active']:>5.0f}"
    secs = (f"{head}{p['s']:>9.3f}{s['s']:>9.3f}{s['s'] / p['s']:>7.1f}{p['s1']:>9.2f}"
            f"{s['s1']:>9.2f}{setup['seconds']:>9.2f}")
    kb = (f"{head}{p['up'] / 1e3:>9.2f}{s['up'] / 1e3:>9.2f}{s['up'] / p['up']:>7.1f}"
          f"{p['down'] / 1e3:>9.2f}{s['down'] / 1e3:>9.2f}{s['down'] / p['down']:>7.1f}"
          f"{setup['up'] / 1e3:>9.1f}{setup['down'] / 1e3:>9.1f}{diff:>10.1e}")
    return secs, kb


HEAD = f"{'model':<6}{'runtime':<12}{'n':>4}{'act':>5}"
SECONDS = (f"{HEAD}{'plain':>9}{'secure':>9}{'ratio':>7}{'r1 plain':>9}{'r1 sec':>9}"
           f"{'set-up':>9}")
KBYTES = (f"{HEAD}{'up pl':>9}{'up sec':>9}{'ratio':>7}{'down pl':>9}{'down sec':>9}"
          f"{'ratio':>7}{'setup up':>9}{'setup dn':>9}{'max diff':>10}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["gmm", "lcr"])
    ap.add_argument("--clients", type=int, nargs="+", default=[5, 10])
    ap.add_argument("--deploy-clients", type=int, nargs="+", default=[5],
                    help="clients of the deployment (one SuperNode process each)")
    ap.add_argument("--rows", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--skip-sim", action="store_true")
    ap.add_argument("--skip-deploy", action="store_true")
    a = ap.parse_args()
    warnings.simplefilter("ignore", fl.ConvergenceWarning)
    runs = [("in-process", n, inprocess) for n in a.clients]
    if not a.skip_sim:
        runs += [("simulation", n, simulation) for n in a.clients]
    if not a.skip_deploy:
        runs += [("deployment", n, deployment) for n in a.deploy_clients]
    table, load = [], [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="bench-secure-flower-") as tmp:
        for model in a.models:
            make_data, _, attr = MODELS[model]
            for name, n, run in runs:
                fd = make_data(n, a.rows)
                fits = {}
                t0 = time.perf_counter()
                for secure in (False, True):
                    est = estimator(model, n, secure, a.rounds)
                    work = Path(tmp) / f"{model}-{name}-{n}-{'secure' if secure else 'plain'}"
                    fits[secure] = inprocess(fd, est) if run is inprocess else run(fd, est, work)
                table.append(rows((model, name, n), fits[False][0], *fits[True], attr))
                load.append(os.getloadavg()[0])
                print(f"[{model}, {name}, {n} clients: both fits in "
                      f"{time.perf_counter() - t0:.0f} s]", flush=True)
    print(f"gmm: GMM d = 4, K = 3; lcr: latent class regression d = 1, K = 2; {a.rows} rows per "
          f"client, participation 0.7, quantizer 8, control variates, {a.rounds} rounds; load "
          f"average {min(load):.1f}-{max(load):.1f} on {os.cpu_count()} cores")
    print(f"\nseconds per round (median of rounds 2..{a.rounds}), round 1 (initialization and "
          "control-variate start), key set-up (once per fit)")
    print(SECONDS)
    print("\n".join(r[0] for r in table))
    print(f"\nKB per round (1 KB = 1000 bytes, median of rounds 2..{a.rounds}, as history_ "
          "counts them), key set-up (history_ adds it to round 1), largest |plain - secure| of "
          "the fitted means (gmm) or coefficients (lcr)")
    print(KBYTES)
    print("\n".join(r[1] for r in table))
    print("act: clients per round (median)")


if __name__ == "__main__":
    main()
