"""What ``fedlatent demo`` (and ``make demo``) runs: a heterogeneous federated mixture.

Thirty clients each dominated by one of three Gaussian components (Dirichlet(0.3) shares) fit a
3-component mixture without pooling their rows. The demo compares the federated fit with
centralized EM (scikit-learn on the pooled rows, same initial parameters), then runs FedEM with
half the clients per round and 4-level quantization, and writes a plot. Both sides' fits are
timed warm: what a first call pays once (imports, compiled kernels) is run and reported first.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import numpy as np

from .data.dataset import ClientData, FederatedDataset
from .engine.fedem.federation import Federation, Quantizer
from .models.gmm import FederatedGaussianMixture
from .plotting import figure, pyplot

__all__ = ["make_demo_data", "run_demo"]

CENTERS = np.array([[-4.0, 0.0], [0.0, 4.0], [4.0, -1.0]])
COVS = np.array([[[1.0, 0.6], [0.6, 1.0]], [[1.5, -0.4], [-0.4, 0.6]], [[0.5, 0.0], [0.0, 2.0]]])


def make_demo_data(n_clients: int = 30, mean_size: int = 1000, alpha: float = 0.3,
                   random_state: int = 0) -> FederatedDataset:
    """Clients with Dirichlet(alpha) shares of three 2-D Gaussians and unequal sizes."""
    rng = np.random.default_rng(random_state)
    clients = {}
    for c in range(n_clients):
        n = int(rng.integers(mean_size // 4, 2 * mean_size))
        share = rng.dirichlet(np.full(3, alpha))
        z = rng.choice(3, size=n, p=share)
        L = np.linalg.cholesky(COVS)
        X = CENTERS[z] + np.einsum("nij,nj->ni", L[z], rng.standard_normal((n, 2)))
        clients[f"site{c:02d}"] = ClientData(X)
    return FederatedDataset(clients, ["x1", "x2"])


def run_demo(out: str | Path = "demo-output", seed: int = 0, progress: bool | None = None) -> str:
    """Run the demo; write ``demo.png`` and ``history.csv`` to ``out``; return a summary text."""
    from sklearn.mixture import GaussianMixture

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    fd = make_demo_data(random_state=seed)
    lines = [
        f"fedlatent demo: {fd.n_clients} clients, {fd.n_samples} samples in R^2, each client "
        "dominated by one of 3 components",
    ]
    X = fd.pooled().X
    lines.append(f"first calls (imports, any compiled kernel loaded): {_warm_up(fd, X, seed):.2f}"
                 " s, not in the times below")
    t0 = time.perf_counter()
    fed = FederatedGaussianMixture(3, tol=1e-6, max_rounds=300, random_state=seed,
                                   federation=Federation(track_h=True),
                                   verbose=progress).fit(fd)
    t_fed = time.perf_counter() - t0
    lines.append(
        f"federated EM (every client, every round): {fed.n_rounds_} rounds, converged="
        f"{fed.converged_}, mean log-likelihood {fed.lower_bound_:.6f}, {t_fed:.2f} s"
    )
    # Centralized EM on the pooled rows (possible here because this is a simulation), from the
    # same initial parameters: the federated iterates are the centralized ones.
    w0, m0, pc0 = _initial_parameters(fd, seed)
    sk = GaussianMixture(3, tol=1e-6, max_iter=300, weights_init=w0, means_init=m0,
                         precisions_init=pc0, init_params="random", random_state=seed)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sk.fit(X)
    t_sk = time.perf_counter() - t0
    order = _match(fed.means_, sk.means_)
    dm = np.max(np.abs(fed.means_ - sk.means_[order]))
    dc = np.max(np.abs(fed.covariances_ - sk.covariances_[order]))
    dw = np.max(np.abs(fed.weights_ - sk.weights_[order]))
    lines.append(
        f"centralized EM (scikit-learn, pooled rows, same start): {sk.n_iter_} iterations, "
        f"mean log-likelihood {sk.score(X):.6f}, {t_sk:.2f} s"
    )
    lines.append(
        f"largest difference federated vs centralized: weights {dw:.1e}, means {dm:.1e}, "
        f"covariances {dc:.1e}"
    )
    # FedEM knobs: half the clients per round, 4-level quantization with control variates
    fedq = Federation(participation=0.5, step_size=0.5, quantizer=Quantizer(4), track_h=True,
                      random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = FederatedGaussianMixture(3, max_rounds=60, federation=fedq, random_state=seed,
                                     verbose=progress).fit(fd)
    h, hq = fed.history_.to_frame(), q.history_.to_frame()
    lines.append(
        f"FedEM, half the clients per round, 4-level quantization: {q.n_rounds_} rounds, mean "
        f"log-likelihood {q.score(fd):.6f}; bytes sent up {int(hq['bytes_up'].sum()):,} "
        f"({hq['bytes_up'].iloc[1:].mean() / max(hq['participants'].iloc[1:].mean(), 1):.0f} "
        f"per client per round vs {h['bytes_up'].iloc[-1] / fd.n_clients:.0f} uncompressed)"
    )
    fed.history_.to_csv(out / "history.csv")
    _plot(fd, fed, sk, order, h, hq, out / "demo.png")
    lines.append(f"wrote {out / 'demo.png'} and {out / 'history.csv'}")
    return "\n".join(lines)


def _warm_up(fd, X, seed) -> float:
    """Seconds of a two-round federated fit and a one-iteration scikit-learn fit: what a
    first call in a process pays once (imports, compiled kernels loaded or built), so that
    the demo times warm fits on both sides."""
    from sklearn.mixture import GaussianMixture

    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        FederatedGaussianMixture(3, max_rounds=2, random_state=seed, verbose=False).fit(fd)
        GaussianMixture(3, max_iter=1, random_state=seed).fit(X)
    return time.perf_counter() - t0


def _initial_parameters(fd, seed):
    """The initial parameters the federated fit used (its default, kmeans-sums start)."""
    est = FederatedGaussianMixture(3, random_state=seed, verbose=False)
    p = est.initial_parameters(fd)
    pc = p["precisions_cholesky"]
    return p["weights"], p["means"], np.einsum("kij,klj->kil", pc, pc)


def _match(a, b):
    from scipy.optimize import linear_sum_assignment

    cost = ((a[:, None, :] - b[None, :, :]) ** 2).sum(-1)
    _, cols = linear_sum_assignment(cost)
    return cols


def _ellipse(ax, mean, cov, **kw):
    vals, vecs = np.linalg.eigh(cov)
    t = np.linspace(0, 2 * np.pi, 100)
    pts = mean + (vecs @ (2 * np.sqrt(vals)[:, None] * np.vstack([np.cos(t), np.sin(t)]))).T
    ax.plot(pts[:, 0], pts[:, 1], **kw)


def _plot(fd, fed, sk, order, h, hq, path):
    with figure(path, ncols=2, figsize=(12, 5.4), dpi=110, tight=False,
                layout="constrained") as (fig, (a1, a2)):
        cmap = pyplot().get_cmap("tab20")
        for i, (_, cd) in enumerate(fd.items()):
            a1.scatter(cd.X[:300, 0], cd.X[:300, 1], s=2, color=cmap(i % 20), alpha=0.5)
        for k in range(3):
            _ellipse(a1, fed.means_[k], fed.covariances_[k], color="k", lw=2,
                     label="federated EM" if k == 0 else None)
            _ellipse(a1, sk.means_[order[k]], sk.covariances_[order[k]], color="orange", lw=1,
                     ls="--", label="centralized EM" if k == 0 else None)
        a1.set_xlabel(fd.feature_names[0])
        a1.set_ylabel(fd.feature_names[1])
        a1.set_title(f"{fd.n_clients} clients (one colour each, 300 rows shown) and the "
                     "fitted components (2-sigma)", fontsize=10)
        a1.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncols=2, frameon=False)
        a2.semilogy(h["round"], h["h_norm2"], marker="o", label="federated EM (all clients)")
        a2.semilogy(hq["round"], hq["h_norm2"], label="FedEM p=0.5, 4-level quantization")
        a2.set_xlabel("round")
        a2.set_ylabel("||h(S)||^2  (distance to an EM fixed point)")
        a2.set_title("convergence in the space of sufficient statistics", fontsize=10)
        a2.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncols=2, frameon=False)
        fig.suptitle("fedlatent demo: federated EM equals centralized EM")
