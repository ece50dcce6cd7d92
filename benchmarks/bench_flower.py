"""Seconds per round and startup cost of one federated GMM fit in the three runtimes.

The same data (3 clients, 20,000 rows each, d = 8, K = 3, full covariances) and the same seed
are fitted in-process, on Flower's simulation engine (Ray) and on a real loopback deployment
(one SuperLink and three SuperNode processes). Prints, for each runtime, the fixed cost (everything
but the rounds: starting the engine or the processes, nodes joining and describing their data,
shutting down), the mean seconds per round as the server measures it (send,
client E-steps, receive, M-step) and its ratio to the in-process round measured in the same run,
and checks that the three fits agree.

    .venv/bin/python benchmarks/bench_flower.py [--rows 20000] [--rounds 8] [--skip-deploy]

Needs ``pip install fedlatent[flower-sim]``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

import fedlatent as fl


def make_data(rows: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(scale=3.0, size=(3, 8))
    data = {}
    for i in range(3):
        z = rng.choice(3, size=rows, p=np.roll([0.7, 0.2, 0.1], i))
        data[f"site-{i}"] = centers[z] + rng.normal(size=(rows, 8))
    return fl.FederatedDataset.from_arrays(data)


def max_diff(a, b) -> float:
    """Largest absolute difference of the fitted weights, means and covariances."""
    return max(float(np.max(np.abs(getattr(a, k) - getattr(b, k))))
               for k in ("weights_", "means_", "covariances_"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--skip-deploy", action="store_true")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    fd = make_data(args.rows)

    def est():
        return fl.FederatedGaussianMixture(3, max_rounds=args.rounds, tol=0.0, random_state=5)

    rows = []
    t0 = time.perf_counter()
    ref = est().fit(fd)
    wall = time.perf_counter() - t0
    per_round = float(np.mean([r.seconds for r in ref.history_]))
    rows.append(("in-process", 0.0, per_round, wall, 0.0))

    from fedlatent.runtime.flower import simulate

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        sim = simulate(est(), fd, workdir=Path(tmp) / "sim")
        wall = time.perf_counter() - t0
        st = sim.flower_status_
        diff = max_diff(sim, ref)
        rows.append(("flower simulation", wall - st["fit_seconds"],
                     st["seconds_per_round"], wall, diff))

        if not args.skip_deploy:
            from fedlatent.data.files import write_client_files
            from fedlatent.runtime.flower_local import local_fit

            paths = write_client_files(fd, Path(tmp) / "data")
            t0 = time.perf_counter()
            dep = local_fit(est(), [paths[c] for c in fd.client_ids], out_dir=Path(tmp) / "dep")
            wall = time.perf_counter() - t0
            st = dep.flower_status_
            diff = max_diff(dep, ref)
            rows.append(("flower deployment", wall - st["fit_seconds"],
                         st["seconds_per_round"], wall, diff))
            procs = dep.flower_deployment_["startup_seconds"]
            print(f"deployment: processes up in {procs:.1f} s, nodes described their data "
                  f"{st['startup_seconds']:.1f} s after the server app started")

    base = rows[0][2]
    print(f"federated GMM, 3 clients x {args.rows} rows, d = 8, K = 3, {args.rounds} rounds")
    print(f"{'runtime':<20}{'fixed s':>11}{'s/round':>10}{'ratio':>8}{'total s':>10}"
          f"{'max |diff|':>12}")
    for name, start, pr, wall, diff in rows:
        print(f"{name:<20}{start:>11.2f}{pr:>10.3f}{pr / base:>8.1f}{wall:>10.2f}{diff:>12.1e}")


if __name__ == "__main__":
    main()
