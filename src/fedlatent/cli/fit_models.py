"""What a fit prints and writes beyond the model, per registered model: the summary lines
of ``fedlatent fit`` and ``flower local`` (:func:`summary`; a model without its own gets the
generic lines) and SEC's files (the similarity matrix, its heat map, the clusters:
:func:`extra_files`). The options of every model come from its table
(:mod:`fedlatent.cli.options`), never from here.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["extra_files", "summary"]


def _converged(est) -> str:
    return f"rounds: {getattr(est, 'n_iter_', '?')}  converged: {getattr(est, 'converged_', '?')}"


def _objective(est) -> float:
    """``lower_bound_`` (the last round's mean objective), else (a model loaded from a file,
    which keeps its history) the history's last objective."""
    value = getattr(est, "lower_bound_", None)
    if value is None:
        history = getattr(est, "history_", None)
        objective = getattr(history, "objective", None)
        value = objective[-1] if objective is not None and len(objective) else float("nan")
    return float(value)


def _size(est, n: tuple[int, int, int]) -> str:
    return f"{type(est).__name__}: {n[0]} clients, {n[1]} samples, {n[2]} features"


def _gmm(est, n) -> list[str]:
    import numpy as np

    with np.printoptions(precision=4, suppress=True):
        weights = f"weights: {est.weights_}"
    return [f"{_size(est, n)}, K={est.n_components_} ({est.covariance_type})",
            f"{_converged(est)}  mean log-likelihood: {_objective(est):.6f}", weights]


def _fedgmm(est, n) -> list[str]:
    return [f"{_size(est, n)}, M1={est.n_input_components_}, M2={est.n_learners_}, classes "
            f"{est.classes_.tolist()}",
            f"{_converged(est)}  mean log h_c(x, y): {_objective(est):.6f}"]


def _hlcr(est, n) -> list[str]:
    import numpy as np

    mse = getattr(getattr(est, "history_", None), "train_mse", None)
    with np.printoptions(precision=4, suppress=True):
        counts = f"entities per cluster: {est.cluster_counts_}"
    return [f"HLCR ({est.solver}): {n[0]} agents, {len(est.labels_)} agent-entity pairs, "
            f"{n[1]} events, {n[2]} features, K={est.n_clusters_}, sigma={est.sigma_:.4g}",
            f"iterations: {est.n_iter_}  converged: {est.converged_}"
            + (f"  training MSE: {mse[-1]:.6g}" if mse is not None and len(mse) else ""),
            counts]


def _sec(est, n) -> list[str]:
    how = " (given)" if est.n_clusters is not None else f" ({est.k_selection})"
    lines = [f"SEC: {len(est.learner_ids_)} learners, {n[1]} samples, {n[2]} features; "
             f"K = {est.n_clusters_}{how}"]
    lines += [f"cluster {k} ({len(members)}): {', '.join(map(str, members))}"
              for k, members in est.clusters().items()]
    return lines


_SUMMARIES: dict[str, Callable[[Any, tuple[int, int, int]], list[str]]] = {
    "gmm": _gmm, "fedgmm": _fedgmm, "hlcr": _hlcr, "sec": _sec}


def summary(name: str, est, n_clients: int, n_samples: int, n_features: int) -> list[str]:
    """The lines a fit of model ``name`` prints: the data's size and the model's own (rounds,
    convergence, the fitted sizes); a model without its own lines gets the generic ones."""
    n = (n_clients, n_samples, n_features)
    own = _SUMMARIES.get(name)
    if own is not None:
        return own(est, n)
    return [_size(est, n)] + ([_converged(est)] if hasattr(est, "n_iter_") else [])


def extra_files(name: str, est) -> Callable[[Path], list[str]] | None:
    """``write(directory) -> names`` of the model's own files (SEC's), or None."""
    if name != "sec":
        return None

    def write_sec_files(where: Path) -> list[str]:  # inside fit_and_save's all-or-nothing dir
        import pandas as pd

        ids = est.learner_ids_
        pd.DataFrame(est.similarity_, index=ids, columns=ids).to_csv(where / "similarity.csv")
        pd.DataFrame({"learner": ids, "cluster": est.labels_, "selected": est.selected_,
                      "n_samples": est.n_samples_, "in_sample_mse": est.errors_}).to_csv(
            where / "clusters.csv", index=False)
        _similarity_heatmap(est, where / "similarity.png")
        return ["similarity.csv", "similarity.png", "clusters.csv"]

    return write_sec_files


def _similarity_heatmap(sec, path: Path) -> None:
    """SEC's similarity matrix, learners ordered by cluster (then by id), clusters outlined."""
    import numpy as np

    from ..plotting import figure

    ids = [str(c) for c in sec.learner_ids_]
    labels = np.asarray(sec.labels_)
    order = np.lexsort((np.array(ids), labels))
    L = len(ids)
    side = float(np.clip(2.5 + 0.17 * L, 5.0, 16.0))
    font = float(np.clip(280.0 / max(L, 1), 6.0, 10.0))
    step = max(1, int(np.ceil(L / 90)))  # at most ~90 tick labels per axis
    with figure(path, figsize=(side + 1.2, side), tight=False, layout="constrained") as (fig, ax):
        im = ax.imshow(sec.similarity_[np.ix_(order, order)], cmap="viridis", vmin=0, vmax=1)
        ticks = np.arange(0, L, step)
        ax.set_xticks(ticks, [ids[order[i]] for i in ticks], rotation=90, fontsize=font)
        ax.set_yticks(ticks, [ids[order[i]] for i in ticks], fontsize=font)
        bounds = np.flatnonzero(np.diff(labels[order])) + 0.5
        for b in bounds:
            ax.axhline(b, color="white", lw=1.2)
            ax.axvline(b, color="white", lw=1.2)
        if bounds.size < 12:  # name the clusters above the map while the names fit
            mid = (np.concatenate([[-0.5], bounds]) + np.concatenate([bounds, [L - 0.5]])) / 2
            top = ax.secondary_xaxis("top")
            top.set_xticks(mid, [f"cluster {int(k)}" for k in np.unique(labels)],
                           fontsize=font + 1)
            top.tick_params(length=0)
        ax.set_xlabel("learner (ordered by cluster)")
        ax.set_ylabel("learner (ordered by cluster)")
        ax.set_title(f"SEC similarity exp(-a V) of {L} learners, a = {sec.affinity_scale_:.3g}; "
                     f"K = {sec.n_clusters_} (white lines separate clusters)", fontsize=10)
        fig.colorbar(im, ax=ax, shrink=0.8, label="similarity S_ij")
