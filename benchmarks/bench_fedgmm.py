"""Benchmark: FedGMM seconds per round on the paper's full synthetic set, against one pooled
E+M iteration of the same model computed centrally in the same run.

Full size: 300 clients of about 3,334 samples (1,000,000 in all), d = 32, M1 = M2 = 3, Newton
learners, full participation. Prints seconds per federated round (rounds 2..end), the rounds to
converge (tol 1e-4 on the mean log-likelihood per sample), the seconds of one centralized
iteration (E-step and M-step of the same model on the pooled arrays, no engine), and the ratio.
Target: a round at most 3x one centralized iteration.

    .venv/bin/python benchmarks/bench_fedgmm.py [--quick] [--max-rounds 100]
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
from _common import blas_limit  # noqa: E402 (this folder is on sys.path)

import fedlatent as fl
from fedlatent.data.fedgmm_data import make_fedgmm_synthetic
from fedlatent.engine.contract.model import ClientStep


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="30 clients of 1,000 samples")
    ap.add_argument("--max-rounds", type=int, default=100)
    ap.add_argument("--threads", type=int, default=1, help="BLAS threads (default 1)")
    args = ap.parse_args()
    n_clients, n_per = (30, 1000) if args.quick else (300, 3334)
    with blas_limit(args.threads):
        t0 = time.perf_counter()
        sp = make_fedgmm_synthetic(n_clients, n_per, fractions=(1.0, 0.0, 0.0), random_state=0)
        fd = sp.train
        print(f"data: {fd.n_clients} clients, {fd.n_samples} samples, d = {fd.n_features} "
              f"({time.perf_counter() - t0:.1f} s to generate)")

        est = fl.FedGMM(3, 3, max_rounds=args.max_rounds, tol=1e-4, random_state=0,
                        verbose=False)
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", fl.ConvergenceWarning)
            est.fit(fd)
        total = time.perf_counter() - t0
        h = est.history_.to_frame()
        per_round = float(h["seconds"].iloc[1:].mean()) if len(h) > 1 else float(h["seconds"][0])

        # one centralized E+M iteration of the same model at the fitted parameters
        model = est._make_model(fd)
        pooled = fd.pooled()
        pi = np.full((3, 3), 1.0 / 9)
        times = []
        for _ in range(3):
            t1 = time.perf_counter()
            step: ClientStep = model.client_stats(est.params_, pooled, {"pi": pi},
                                                  np.random.default_rng(0))
            model.server_step(step.stats / step.n, est.params_, float(step.n))
            times.append(time.perf_counter() - t1)
        central = min(times)
    print(f"federated fit: {est.n_rounds_} rounds, converged: {est.converged_}, "
          f"{total:.1f} s in all (initialization included)")
    print(f"seconds per federated round (rounds 2..{est.n_rounds_}): {per_round:.3f}")
    print(f"seconds per centralized E+M iteration (pooled arrays): {central:.3f}")
    print(f"ratio round / centralized iteration: {per_round / central:.2f} (target <= 3)")


if __name__ == "__main__":
    main()
