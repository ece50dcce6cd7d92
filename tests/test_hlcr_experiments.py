import numpy as np
import pytest

from fedlatent.experiments import hlcr_figure3


@pytest.fixture(scope="module")
def fig3(tmp_path_factory):
    out = tmp_path_factory.mktemp("fig3")
    return hlcr_figure3(quick=True, out=out, random_state=0), out


def test_figure3_writes_tables_and_plots(fig3):
    df, out = fig3
    assert set(df.panel) == {"a", "b", "c"}
    for p in "abc":
        assert (out / f"fig3{p}.png").stat().st_size > 1000
        assert (out / f"fig3{p}.csv").exists()
    np.testing.assert_allclose(df.mse_over_sigma2, df.mse / np.where(df.panel == "a", df.sigma,
                                                                     1.0) ** 2)


def test_figure3a_enough_data_reaches_the_noise_floor(fig3):
    df, _ = fig3
    a = df[df.panel == "a"]
    assert len(a) == 4
    rich = a[a.n_2star == 20].set_index("sigma").mse_over_sigma2
    poor = a[a.n_2star == 5].set_index("sigma").mse_over_sigma2
    # 20 events per pair: close to the optimal MSE sigma^2; 5 events per pair: worse
    assert (rich < 1.25).all()
    assert (poor > rich).all()
    # FedHLCR converges fast: within 2% of its final test MSE in at most 10 iterations
    assert (a.iter_within_2pct <= 10).all()


def test_figure3b_has_every_iteration_and_converges_at_small_gamma(fig3):
    df, _ = fig3
    b = df[df.panel == "b"]
    n_iter = int(b.iteration.max())
    assert len(b) == n_iter * 7  # 4 gammas of the paper + 3 engine variants
    small = b[(b.variant == "paper") & (b.gamma == 0.2)].sort_values("iteration").mse.to_numpy()
    assert small[-1] < 0.5 * small[0]


def test_figure3c_full_participation_is_stable_for_every_gamma(fig3):
    df, _ = fig3
    c = df[df.panel == "c"]
    full = c[c.fraction == 1.0].mse_over_sigma2
    assert (full < 1.25).all()
    # with few agents per iteration a full step (gamma = 1) is worse than gamma = 0.1
    few = c[c.fraction < 1.0].set_index("gamma").mse
    assert few[1.0] > few[0.1]
