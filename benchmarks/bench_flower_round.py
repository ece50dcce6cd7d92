"""A deployed round of a small GMM against Flower's own empty Message-API round, in each of
Flower's isolation modes (issue 40, item 4).

The fit is the issue's case: 3 sites of 40 rows (d = 2), ``FederatedGaussianMixture(2)`` run
for ``--rounds`` rounds (tol 0), on a loopback deployment (one SuperLink, three SuperNodes).
On the same deployment, before and after the fit, the empty app of ``bench_flower.py`` (a
ServerApp sending each node four floats per round, a ClientApp adding one; the same pull
schedule as fedlatent's server) measures Flower's floor: SuperNode polling (a SuperNode with
nothing to do sleeps 3 s before it asks again), the SuperExec's poll, one ``flwr-clientapp``
process per message. Both isolation modes are measured, each on its own deployment:
``subprocess`` (each SuperNode starts its SuperExec) and ``process`` (the SuperNode runs
``--isolation process``; a ``flower-superexec`` is started beside it).

Printed per mode: the empty round (median, first round of each empty run left out: it includes
the nodes' first contact with the run), fedlatent's round (median of rounds 2 on; round 1 is
the initialization round and the control variates' start), their ratio, and how long after
``flwr run`` started the server app had every node's answer to its first message
(``answered_at`` in ``status.json``; the deployment was ready before ``flwr run``), and when
its own estimator was imported too (``estimator_ready_at``: the server imports it in a thread
while the nodes answer), beside when the empty app had every node's answer to its first message
(each empty run's first round: the nodes' first contact with a run, Flower's floor for it).
First, in
process, the rounds the default fit takes to its default tolerance, plain and under
``acceleration="newton"`` (what a deployment would save by Newton: a round costs one exchange
either way).

    .venv/bin/python benchmarks/bench_flower_round.py [--rounds 5] [--floor-rounds 8]
                                                      [--modes subprocess,process]

Needs ``pip install fedlatent[flower]``. Wall seconds: run it on a machine as quiet as you can.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_flower import write_floor_app  # noqa: E402  (the empty app, Flower's floor)

import fedlatent as fl  # noqa: E402


def make_data(rows: int = 40, sites: int = 3, seed: int = 0):
    """``sites`` sites of ``rows`` rows in two dimensions, alternately around -3 and +3."""
    rng = np.random.default_rng(seed)
    return fl.FederatedDataset.from_arrays(
        {f"site{s}": rng.normal(size=(rows, 2)) + (3.0 if s % 2 else -3.0)
         for s in range(sites)})


def one_mode(isolation: str, rounds: int, floor_rounds: int, tmp: Path) -> dict:
    """The empty rounds and fedlatent's rounds on one deployment of ``isolation``."""
    from fedlatent.data.files import write_client_files
    from fedlatent.runtime.flower import load_result, run_config_for
    from fedlatent.runtime.flower_local import LocalDeployment, run_app, write_app

    fd = make_data()
    paths = write_client_files(fd, tmp / "data")
    files = [paths[c] for c in fd.client_ids]
    est = fl.FederatedGaussianMixture(2, max_rounds=rounds, tol=0.0, random_state=0)
    app = write_app(tmp / "app", run_config_for(est, out_dir=tmp / "fit", min_nodes=3))
    half = max(2, floor_rounds // 2)
    floors = [write_floor_app(tmp / f"floor-app-{i}", tmp / f"floor-{i}", half + 1, 3)
              for i in (0, 1)]
    with LocalDeployment(files, workdir=tmp / "deploy", isolation=isolation) as dep:
        run_app(floors[0], dep, timeout=1800)
        floor_started = [dep.last_run_started_at]
        run_app(app, dep, timeout=1800)
        started = dep.last_run_started_at
        run_app(floors[1], dep, timeout=1800)
        floor_started.append(dep.last_run_started_at)
    fitted = load_result(tmp / "fit")
    st = fitted.flower_status_
    runs = [json.loads((tmp / f"floor-{i}" / "floor.json").read_text()) for i in (0, 1)]
    empty = [s for run in runs for s in run["seconds"][1:]]
    ours = [r.seconds for r in fitted.history_][1:]
    return {"mode": isolation, "empty": empty, "ours": ours,
            "empty_answered_after": [r["answered_at"] - t for r, t in zip(runs, floor_started)],
            "empty_started_after": [r["app_started_at"] - t for r, t in zip(runs, floor_started)],
            "answered_after": st["answered_at"] - started,
            "ready_after": st.get("estimator_ready_at", float("nan")) - started,
            "app_started_after": st["app_started_at"] - started,
            "first_round": fitted.history_[0].seconds, "rounds": len(fitted.history_),
            "startup": dep.startup_seconds}


def newton_rounds(seeds: int = 6) -> None:
    """Rounds of the default fit to its default tolerance, plain and ``acceleration="newton"``
    (a deployed round costs about one empty Flower round, whatever the points it carries; the
    runtimes give the same rounds, so they are counted in-process): the deployment's data and
    rounds_to_tol.py's overlapping GMM (K = 4, d = 5, 20 clients), ``seeds`` seeds each."""
    import rounds_to_tol as rtt

    cases = {"3 sites x 40 rows, K=2": lambda s: (make_data(seed=s), 2),
             "rounds_to_tol GMM, K=4": lambda s: (rtt.gmm_data(s)[1], 4)}
    print(f"rounds to the default tolerance (tol='auto': within 0.1 standard error), {seeds} seeds "
          "each, in-process (the rounds a deployment runs)")
    print("| data | plain rounds (median, total) | newton rounds (median, total) | saved |")
    print("|---|---|---|---|")
    for label, make in cases.items():
        got = {None: [], "newton": []}
        for s in range(seeds):
            fd, K = make(s)
            for acc in got:
                fed = fl.Federation(acceleration=acc) if acc else fl.Federation()
                est = fl.FederatedGaussianMixture(K, random_state=s, federation=fed,
                                                  max_rounds=500).fit(fd)
                got[acc].append(int(est.n_iter_))
        a, b = got[None], got["newton"]
        print(f"| {label} | {np.median(a):.0f} ({sum(a)}) | {np.median(b):.0f} ({sum(b)}) | "
              f"{1 - sum(b) / sum(a):.0%} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="fedlatent's rounds (tol 0)")
    ap.add_argument("--floor-rounds", type=int, default=8, help="empty rounds (both runs)")
    ap.add_argument("--modes", default="subprocess,process")
    ap.add_argument("--newton-seeds", type=int, default=6,
                    help="seeds of the plain / newton rounds table (0: none)")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    if args.newton_seeds:
        newton_rounds(args.newton_seeds)
    rows = []
    for mode in args.modes.split(","):
        with tempfile.TemporaryDirectory(prefix=f"fedlatent-round-{mode}-") as tmp:
            rows.append(one_mode(mode, args.rounds, args.floor_rounds, Path(tmp)))
    print(f"GMM K=2 on 3 sites x 40 rows (d=2), {args.rounds} rounds, loopback deployment; "
          "Flower's empty Message-API round on the same deployment before and after the fit; "
          f"load average at the end {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print("| isolation | empty round s (median) | fedlatent round s (median, rounds 2+) | "
          "ratio | round 1 s | server app answered, s after flwr run | its process started, "
          "s after flwr run | its estimator imported, s after flwr run | the empty app "
          "answered (its process started), s after flwr run |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        e, o = float(np.median(r["empty"])), float(np.median(r["ours"]))
        floor = ", ".join(f"{a:.1f} ({b:.1f})" for a, b in
                          zip(r["empty_answered_after"], r["empty_started_after"]))
        print(f"| {r['mode']} | {e:.2f} ({', '.join(f'{s:.1f}' for s in r['empty'])}) | "
              f"{o:.2f} ({', '.join(f'{s:.1f}' for s in r['ours'])}) | {o / e:.2f} | "
              f"{r['first_round']:.2f} | {r['answered_after']:.1f} | "
              f"{r['app_started_after']:.1f} | {r['ready_after']:.1f} | "
              f"{floor} |", flush=True)
    best = min(rows, key=lambda r: float(np.median(r["empty"])))
    print(f"fastest isolation mode: {best['mode']}; fedlatent round / its empty round = "
          f"{float(np.median(best['ours'])) / float(np.median(best['empty'])):.2f}")


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"({time.perf_counter() - t0:.0f} s)")
