"""A site that refuses a fit's setup by a disclosure rule (or its own policy) is left out by
name and the others go on (``Federation(on_refusal="exclude")``, the default): the fit equals
one on the other sites, warns once naming the site, and records it."""

import warnings

import numpy as np
import pandas as pd
import pytest

import fedlatent as fl
from fedlatent.engine import FederatedFitError, InProcessRuntime
from fedlatent.engine.contract.registry import estimator_names
from fedlatent.engine.contract.registry import example as registry_example
from fedlatent.engine.protocol.runtime import Runtime
from fedlatent.engine.warn import SitesExcludedWarning
from tolerance import assert_close, assert_same

TINY = "zz-tiny"


def _twelve_and_a_tiny(tiny_rows: int = 6, seed: int = 0):
    """12 sites of 300 rows (two overlapping 2-d clusters) and one of ``tiny_rows``."""
    rng = np.random.default_rng(seed)
    data = {f"s{i:02d}": np.r_[rng.normal(0, 1, (150, 2)), rng.normal(2, 1.2, (150, 2))]
            for i in range(12)}
    return data, {**data, TINY: rng.normal(1, 1, (tiny_rows, 2))}


def _fit_recording(est, fd, **kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        est.fit(fd, **kw)
    return est, [w for w in caught if issubclass(w.category, SitesExcludedWarning)]


@pytest.mark.parametrize("batched", [True, False], ids=["batched", "one-by-one"])
def test_a_gaussian_mixture_leaves_the_tiny_site_out_and_equals_the_fit_without_it(batched):
    twelve, thirteen = _twelve_and_a_tiny()
    rt = InProcessRuntime(fl.FederatedDataset.from_arrays(thirteen), batched=batched)
    gm, warned = _fit_recording(fl.FederatedGaussianMixture(2, random_state=0),
                                rt._fd, runtime=rt)
    alone = fl.FederatedGaussianMixture(2, random_state=0).fit(
        fl.FederatedDataset.from_arrays(twelve))
    assert gm.n_iter_ == alone.n_iter_ >= 3
    assert_close(gm.means_, alone.means_, rtol=1e-10)
    assert_close(gm.covariances_, alone.covariances_, rtol=1e-10)
    assert len(warned) == 1  # one warning, naming the site, the rule and the fix
    text = str(warned[0].message)
    assert f"'{TINY}'" in text and "1 of 13 sites left out" in text
    assert "max_parameters_per_record" in text and "Merge sites to at least 19" in text
    assert list(gm.excluded_clients_) == [TINY]
    assert "12 free numbers about 6 record(s)" in gm.excluded_clients_[TINY]
    assert gm.history_.excluded == gm.excluded_clients_
    assert gm.history_.to_frame().attrs["excluded"] == gm.excluded_clients_
    assert all(TINY not in r.missing for r in gm.history_)  # never asked after the setup


def test_the_left_out_site_is_in_the_summary_the_saved_model_and_its_predictions(tmp_path):
    _, thirteen = _twelve_and_a_tiny()
    fd = fl.FederatedDataset.from_arrays(thirteen)
    gm, _ = _fit_recording(fl.FederatedGaussianMixture(2, random_state=0), fd)
    assert f"1: '{TINY}'" in gm.summary().info["Sites left out"]  # (the fit's 12 sites' SEs)
    gm.save(tmp_path / "m")
    back = fl.FederatedGaussianMixture.load(tmp_path / "m")
    assert back.excluded_clients_ == gm.excluded_clients_ == back.history_.excluded
    with pytest.warns(SitesExcludedWarning, match=f"'{TINY}' were left out of the fit.*"
                      "population-level model"):
        pred = gm.predict_dataset(fd)
    assert_same(pred.to_numpy()[-6:], gm.predict(thirteen[TINY]))  # labels: integers


def test_stop_keeps_todays_behaviour_and_min_clients_bounds_what_goes_on():
    twelve, thirteen = _twelve_and_a_tiny()
    fd = fl.FederatedDataset.from_arrays(thirteen)
    stop = fl.Federation(on_refusal="stop")
    with pytest.raises(FederatedFitError, match=f"setup: client '{TINY}': the round statistic "
                       "carries 12 free numbers") as err:
        fl.FederatedGaussianMixture(2, random_state=0, federation=stop).fit(fd)
    assert err.value.clients == [TINY]
    with pytest.raises(FederatedFitError, match=r"1 of 13 clients refused .* leaving 12, fewer "
                       r"than Federation\(min_clients=13\)"):
        fl.FederatedGaussianMixture(2, federation=fl.Federation(min_clients=13)).fit(fd)
    pair = fl.FederatedDataset.from_arrays({"big": twelve["s00"], TINY: thirteen[TINY]})
    with pytest.raises(FederatedFitError, match=r"leaving 1, fewer than Federation\("
                       r"min_clients=2\)"):  # the default: two sites
        fl.FederatedGaussianMixture(2, random_state=0).fit(pair)
    one, warned = _fit_recording(fl.FederatedGaussianMixture(
        2, random_state=0, federation=fl.Federation(min_clients=1)), pair)
    assert one.excluded_clients_.keys() == {TINY} and len(warned) == 1
    for bad in ("skip", None):
        with pytest.raises(ValueError, match="on_refusal=.... must be 'exclude'"):
            fl.Federation(on_refusal=bad).validate()
    with pytest.raises(ValueError, match=r"min_clients=...\) must be None or an integer >= 1"):
        fl.Federation(min_clients=0).validate()


class _Failing(Runtime):
    """In-process clients, one of which fails its setup (an error, not a refusal)."""

    def __init__(self, fd, who):
        self.inner, self.who = InProcessRuntime(fd, batched=False), who

    @property
    def client_ids(self):
        return self.inner.client_ids

    def call(self, client_ids, method, messages):
        out = self.inner.call(client_ids, method, messages)
        if method == "setup" and self.who in out:
            out[self.who] = {"engine/error": "OSError: disk full"}
        return out


def test_a_site_that_fails_its_setup_still_stops_the_fit():
    twelve, _ = _twelve_and_a_tiny()
    fd = fl.FederatedDataset.from_arrays(twelve)
    with pytest.raises(FederatedFitError, match="setup: client 's03': OSError: disk full"):
        fl.FederatedGaussianMixture(2, random_state=0).fit(fd, runtime=_Failing(fd, "s03"))


def test_a_site_refused_by_its_own_policy_is_left_out_under_secure_aggregation():
    """A site whose policy does not answer this model refuses the setup: left out, and the
    secure channel is set up among the others (their threshold)."""
    from fedlatent.engine.site import SitePolicy

    twelve, _ = _twelve_and_a_tiny()
    fd = fl.FederatedDataset.from_arrays(twelve)
    fed = fl.Federation(secure_aggregation=True)
    policy = SitePolicy.from_dict({"answer": {"models": ["lcr"]}})
    rt = InProcessRuntime(fd, policies={"s05": policy})
    gm, warned = _fit_recording(fl.FederatedGaussianMixture(2, random_state=0, max_rounds=6,
                                                            tol=0, federation=fed), fd,
                                runtime=rt)
    assert list(gm.excluded_clients_) == ["s05"] and len(warned) == 1
    assert "refused (answer.models): model 'gmm' is not one it answers" in \
        gm.excluded_clients_["s05"]
    rest = fl.FederatedGaussianMixture(2, random_state=0, max_rounds=6, tol=0,
                                       federation=fed).fit(
        fd.subset([c for c in fd.client_ids if c != "s05"]))
    assert_close(gm.means_, rest.means_, rtol=1e-10)


def test_auto_compares_the_candidates_on_the_same_sites_then_fits_the_choice_on_all_it_may():
    """``n_components="auto"``: the tiny site, refused at every size, is left out; a 30-row
    site refuses K = 4 only, so the candidates are compared on the 12 others, and the chosen
    size (which it admits) is fitted on the 13: one warning says both."""
    twelve, thirteen = _twelve_and_a_tiny()
    data = {**thirteen, "mid": twelve["s00"][:30]}  # 30 rows of 2 admit 19.8 numbers: K <= 3
    fd = fl.FederatedDataset.from_arrays(data)
    cands = [1, 2, 3, 4]
    gm, warned = _fit_recording(fl.FederatedGaussianMixture(
        "auto", n_components_candidates=cands, random_state=0), fd)
    assert list(gm.excluded_clients_) == [TINY] and len(warned) == 1
    assert "also left out of that comparison: 'mid'" in str(warned[0].message)
    compared = fl.FederatedGaussianMixture("auto", n_components_candidates=cands,
                                           random_state=0).fit(fl.FederatedDataset.from_arrays(
                                               twelve))
    assert_close(gm.selection_scores_["bic"].to_numpy(),
                 compared.selection_scores_["bic"].to_numpy(), rtol=1e-10)
    assert gm.n_components_ == compared.n_components_ == 2
    final = fl.FederatedGaussianMixture(2, random_state=0).fit(
        fd.subset([c for c in fd.client_ids if c != TINY]))
    assert_close(gm.means_, final.means_, rtol=1e-10)


def test_auto_leaves_out_the_candidates_that_would_leave_too_few_sites():
    twelve, _ = _twelve_and_a_tiny()
    fd = fl.FederatedDataset.from_arrays({"a": twelve["s00"], "b": twelve["s01"],
                                          "mid": twelve["s02"][:30]})
    gm, warned = _fit_recording(fl.FederatedGaussianMixture(
        "auto", n_components_candidates=[1, 2, 4], random_state=0,
        federation=fl.Federation(min_clients=3)), fd)
    assert gm.excluded_clients_ == {} and warned == []
    assert gm.selection_scores_.loc[4, "error"].startswith(
        "n_components=4 is not fitted: only 2 site(s) admit it")
    assert gm.selection_scores_.loc[[1, 2], "error"].eq("").all()


def _with_site(fd, rows: int | None = None):
    """``fd`` and a site copied from its first client (its first ``rows`` rows; None: all)."""
    first = fd.clients[fd.client_ids[0]]
    return fd._like({**fd.clients, TINY: first if rows is None else first.take(np.arange(rows))})


def _fitted_equal(ex, est, ref):
    for k in ex.fitted_arrays(type(est)):
        a, b = np.asarray(getattr(est, k)), np.asarray(getattr(ref, k))
        if a.dtype.kind in "fc":
            assert_close(a, b, rtol=1e-10, err_msg=k)
        else:
            assert_same(a, b, err_msg=k)  # labels, counts: integers


def _reference(case, fd):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return case.make().fit(fd)


@pytest.mark.parametrize("name", estimator_names())
def test_every_model_leaves_out_a_site_its_own_policy_refuses(name):
    """Through the registry's example of each model: a site whose policy answers another model
    is left out with one warning, and the fitted arrays equal the fit without it."""
    from fedlatent.engine.site import SitePolicy

    ex = registry_example(name)
    case = ex.case()
    fd = case.data()
    other = next(n for n in estimator_names() if n != name)
    rt = InProcessRuntime(_with_site(fd), policies={
        TINY: SitePolicy.from_dict({"answer": {"models": [other]}})})
    est, warned = _fit_recording(case.make(), rt._fd, runtime=rt)
    assert list(est.excluded_clients_) == [TINY] and len(warned) == 1
    assert f"site '{TINY}' refused (answer.models)" in est.excluded_clients_[TINY]
    _fitted_equal(ex, est, _reference(case, fd))


@pytest.mark.parametrize("name", estimator_names())
def test_every_model_leaves_a_two_row_site_out_or_names_it(name):
    """A site of two rows (an HLCR agent of two events: fewer than the default
    ``min_records=3``) is left out with one warning and the others fitted as without it; a
    model that needs more rows per site than that for its own sake (SEC's half-half
    validation) refuses the data first, naming the site."""
    from fedlatent.data.validation import DataValidationError

    ex = registry_example(name)
    case = ex.case()
    fd = case.data()
    try:
        est, warned = _fit_recording(case.make(), _with_site(fd, 2))
    except DataValidationError as err:  # SEC alone needs more rows per site for its own sake
        assert name == "sec" and f"client '{TINY}' has 2 samples" in str(err)
        return
    assert list(est.excluded_clients_) == [TINY] and len(warned) == 1
    assert "min_records=3" in est.excluded_clients_[TINY]
    _fitted_equal(ex, est, _reference(case, fd))


def _one_event_entities(seed: int) -> fl.FederatedDataset:
    """4 agents of 60 entities with one event each (two regression lines)."""
    rng = np.random.default_rng(seed)
    rows = []
    for a in range(4):
        X = rng.normal(size=(60, 2))
        k = rng.integers(2, size=60)
        y = np.where(k == 1, X @ [1.0, -1.0], X @ [-2.0, 0.5]) + rng.normal(0, 0.5, 60)
        rows += [{"agent": f"a{a}", "entity": f"e{a}_{e}", "x1": X[e, 0], "x2": X[e, 1],
                  "y": y[e]} for e in range(60)]
    return fl.FederatedDataset.from_pandas(pd.DataFrame(rows), client="agent",
                                           features=["x1", "x2"], target="y",
                                           entity="entity")


@pytest.mark.parametrize("seed", range(10))
def test_hlcr_finishes_when_disclosure_suppresses_every_block_of_a_round(seed):
    """One-event entities under the default rules: differencing suppresses more and more of
    each agent's cluster blocks (a round at ~30-55 reports no event at all); the M-step stays
    finite (before: "M-step gave non-finite ['train_mse']", every seed) and the fit runs its
    rounds."""
    fd = _one_event_entities(seed)
    est = fl.HLCR(n_clusters=2, random_state=seed, max_rounds=60, standardize=False,
                  federation=fl.Federation(control_variates=False))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        est.fit(fd)
    assert est.n_iter_ == 60
    mse = est.history_.to_frame()["train_mse"].to_numpy()
    # what the issue asks: every round's statistic finite, and a model that predicts finite
    # values (the training MSE itself is of the blocks the rules let through: it swings
    # between ~0.1 and the targets' variance as suppression grows, so it pins nothing)
    assert np.isfinite(mse).all()
    cid = fd.client_ids[0]
    pred = est.predict(fd[cid].X, np.full(60, cid), np.asarray(fd[cid].entity).astype(str))
    assert pred.shape == (60,) and np.isfinite(pred).all()


@pytest.mark.slow
def test_hlcr_default_fit_of_one_event_entities_finishes(seed=0):
    """The same data with every default (K chosen among 1-6: K = 5 and 6, which every agent
    refuses, are not fitted; the others are compared on every agent). One seed here (20-60
    s); the ten of the issue finished alike."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = fl.HLCR(random_state=seed).fit(_one_event_entities(seed))
    assert 1 <= est.n_clusters_ <= 6 and est.excluded_clients_ == {}
    assert np.isfinite(est.history_.to_frame()["train_mse"].to_numpy()).all()


def _docs_table() -> dict[str, list[int]]:
    """docs/privacy.md's table of the smallest site the default rules admit: model -> the
    nine sizes (d = 2, 5, 10; K = 2, 3, 5)."""
    from pathlib import Path

    text = (Path(__file__).parents[2] / "docs" / "privacy.md").read_text(encoding="utf-8")
    section = text.split("### The smallest site the default rules admit")[1].split("###")[0]
    out = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[3][:1].isdigit():
            out[cells[0]] = [int(v) for c in cells[3:] for v in c.split(", ")]
    return out


def _model_sizes(build, K: int, d: int, rng) -> int:
    """The smallest site for the model ``build(K, d)`` makes, from its own reply_numbers."""
    est, fd = build(K, d, rng)
    est._validate_params()
    model = est._make_model(fd)
    cd = fd.clients[fd.client_ids[0]]
    return fl.DisclosurePolicy().smallest_site(model.reply_numbers(cd), model.record_width(cd))


def _plain(K, d, rng, **kw):
    X = rng.normal(size=(60, d))
    return fl.FederatedGaussianMixture(K, **kw), fl.FederatedDataset.from_arrays({"a": X})


def _lcr(K, d, rng):
    X, y = rng.normal(size=(60, d)), rng.normal(size=60)
    return fl.LatentClassRegression(K), fl.FederatedDataset.from_arrays({"a": (X, y)})


def _lca(K, d, rng):
    X = rng.integers(0, 2, size=(60, d)).astype(float)
    return fl.LatentClassAnalysis(K), fl.FederatedDataset.from_arrays({"a": X})


def _hlcr(K, d, rng):
    X, y = rng.normal(size=(60, d)), rng.normal(size=60)
    fd = fl.FederatedDataset.from_arrays({"a": (X, y, np.repeat(np.arange(12), 5))})
    return fl.HLCR(n_clusters=K, random_intercept=True), fd


DOC_MODELS = {
    "GMM, full covariances": lambda K, d, r: _plain(K, d, r),
    'GMM, `covariance_type="diag"`': lambda K, d, r: _plain(K, d, r, covariance_type="diag"),
    "LCR (intercept: `p = d + 1`)": _lcr,
    "LCA, binary items": _lca,
    "HLCR, random intercept (`p = d + 1`)": _hlcr,
}


def test_the_privacy_page_gives_the_smallest_site_each_model_declares():
    table = _docs_table()
    assert set(table) == set(DOC_MODELS)
    rng = np.random.default_rng(0)
    for row, build in DOC_MODELS.items():
        got = [_model_sizes(build, K, d, rng) for d in (2, 5, 10) for K in (2, 3, 5)]
        assert got == table[row], row


def test_many_sites_left_out_are_named_with_each_fix_said_once(caplog):
    """Thirteen sites too small for the saturation rule: the warning and the setup's log name
    ten of them and count the rest, and say the rule's fix once, not once per site (before:
    once per distinct record count, 2.6 kB; Chem97's authorities: kilobytes a line)."""
    rng = np.random.default_rng(0)
    twelve, _ = _twelve_and_a_tiny()
    tiny = {f"{TINY}{j:02d}": rng.normal(1, 1, (3 + j % 4, 2)) for j in range(13)}
    fd = fl.FederatedDataset.from_arrays({**twelve, **tiny})
    with caplog.at_level("INFO", logger="fedlatent.engine.protocol.exchange"):
        gm, warned = _fit_recording(fl.FederatedGaussianMixture(2, random_state=0,
                                                                max_rounds=3), fd)
    assert sorted(gm.excluded_clients_) == sorted(tiny)
    logged = [r.getMessage() for r in caplog.records if "setup: left out" in r.getMessage()]
    for text in (str(warned[0].message), logged[0]):
        assert text.count("Merge sites to at least 19 records") == 1
        assert text.count("max_parameters_per_record") == 1
        assert [n for n in tiny if f"'{n}'" in text] == sorted(tiny)[:10]
        assert "each with its own figures" in text and "; and 3 more client(s)" in text
        assert len(text) < 1200, len(text)
    assert "12 free numbers about 3 record(s)" in gm.excluded_clients_[f"{TINY}00"]
    assert "12 free numbers about 6 record(s)" in gm.excluded_clients_[f"{TINY}03"]


def test_refusal_detail_says_each_fix_once_and_names_at_most_ten():
    from fedlatent.engine.protocol.messages import refusal_detail

    policy = {f"s{i}": f"site 's{i}' refused (answer.models): it answers 'lcr' only; fix: "
              "fit one of them" for i in range(12)}
    text = refusal_detail(policy)
    assert text.startswith("client 's0': site 's0' refused (answer.models): it answers 'lcr' "
                           "only (also clients 's1', 's2', 's3', 's4', 's5', 's6', 's7', 's8', "
                           "'s9'); fix: fit one of them; and 2 more client(s)")
    same = {"a": "too small; fix: merge", "b": "2 rows, too small; fix: merge",
            "c": "no fix here"}
    assert refusal_detail(same) == ("client 'a': too small (also client 'b', each with its own "
                                    "figures); fix: merge; client 'c': no fix here")
    assert refusal_detail(same, limit=1) == "client 'a': too small; fix: merge; and 2 more " \
                                            "client(s)"
