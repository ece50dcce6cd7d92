"""`fedlatent fit sec`'s similarity heat map (issue 14, section 7): learners ordered by cluster,
clusters outlined, readable labels, titles, axis labels, constrained layout."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.figure import Figure
from matplotlib.layout_engine import ConstrainedLayoutEngine

from fedlatent.cli.fit_models import _similarity_heatmap
from fedlatent.data.dataset import FederatedDataset
from fedlatent.models.sec import SEC


@pytest.fixture(scope="module")
def interleaved_sec():
    """12 learners whose ids alternate between two slopes: id order is not cluster order."""
    rng = np.random.default_rng(0)
    data = {}
    for i in range(12):
        X = rng.standard_normal((30, 2))
        beta = [2.0, -1.0] if i % 2 else [-2.0, 1.0]
        data[f"l{i:02d}"] = (X, X @ beta + 0.1 * rng.standard_normal(30))
    fd = FederatedDataset.from_arrays(data)
    return SEC(candidates="linear", n_clusters=2, random_state=0).fit(fd)


@pytest.fixture()
def saved(monkeypatch):
    figs = []
    orig = Figure.savefig

    def keep(self, *a, **k):
        figs.append(self)
        return orig(self, *a, **k)

    monkeypatch.setattr(Figure, "savefig", keep)
    return figs


def test_heatmap_is_ordered_by_cluster_with_readable_labels(interleaved_sec, saved, tmp_path):
    sec = interleaved_sec
    _similarity_heatmap(sec, tmp_path / "similarity.png")
    assert (tmp_path / "similarity.png").stat().st_size > 0
    (fig,) = saved
    assert isinstance(fig.get_layout_engine(), ConstrainedLayoutEngine)
    ax = fig.axes[0]
    shown = [t.get_text() for t in ax.get_xticklabels()]
    assert shown == [t.get_text() for t in ax.get_yticklabels()]
    assert sorted(shown) == sorted(sec.learner_ids_)
    lab = dict(zip(sec.learner_ids_, sec.labels_))
    # the two interleaved groups come out as two blocks, each in id order
    assert [lab[c] for c in shown] == sorted(lab[c] for c in shown)
    assert {tuple(shown[:6]), tuple(shown[6:])} == {
        tuple(f"l{i:02d}" for i in range(0, 12, 2)), tuple(f"l{i:02d}" for i in range(1, 12, 2))}
    idx = [sec.learner_ids_.index(c) for c in shown]
    np.testing.assert_array_equal(ax.images[0].get_array(), sec.similarity_[np.ix_(idx, idx)])
    assert min(t.get_fontsize() for t in ax.get_xticklabels()) >= 6
    assert ax.get_xlabel() == ax.get_ylabel() == "learner (ordered by cluster)"
    assert ax.get_title().startswith("SEC similarity exp(-a V) of 12 learners")
    # one white line between the clusters, each way
    assert [ln.get_ydata()[0] for ln in ax.get_lines() if ln.get_xdata()[0] == 0] == [5.5]
    assert fig.axes[-1].get_ylabel() == "similarity S_ij"  # the colour bar


def test_heatmap_of_many_learners_thins_its_labels(saved, tmp_path):
    class Fitted:  # what the heat map reads of a fitted SEC
        learner_ids_ = [f"learner{i:03d}" for i in range(200)]
        labels_ = np.arange(200) % 3
        similarity_ = np.eye(200)
        affinity_scale_ = 1.0
        n_clusters_ = 3

    _similarity_heatmap(Fitted(), tmp_path / "s.png")
    ax = saved[0].axes[0]
    assert len(ax.get_xticklabels()) == 67  # every third learner: at most 90 labels
    assert ax.get_xticklabels()[0].get_fontsize() == 6.0
