"""A site operator's path on the command line (issue 41): ``site try`` (a dry run of a fit
against the site's own policy, its ledger untouched), ``site ledger --full``, and the help of
``site`` written whole."""

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import fedlatent as fl
from fedlatent.cli import app
from fedlatent.engine.site.ledger import LEDGER_FILE, Ledger

runner = CliRunner()

POLICY = """
[site]
name = "hospital-a"
directory = "site-a"

[privacy]
required = true
max-epsilon = 1.0
lifetime-epsilon = 1.0
lifetime-delta = 1e-6
"""


@pytest.fixture
def site(tmp_path):
    """A policy file, its site's own rows (no client column) and the same rows as a dataset."""
    (tmp_path / "policy.toml").write_text(POLICY)
    rng = np.random.default_rng(0)
    rows = pd.DataFrame(np.vstack([rng.normal(size=(100, 2)), rng.normal(4, 1, size=(100, 2))]),
                        columns=["x1", "x2"])
    rows.to_csv(tmp_path / "mine.csv", index=False)
    return tmp_path


def _try(site, *extra):
    return runner.invoke(app, ["site", "try", "gmm", "--policy", str(site / "policy.toml"),
                               "--data", str(site / "mine.csv"), "-k", "2", *extra])


def test_site_try_says_what_the_policy_refuses_with_the_fix_as_an_option(site):
    res = _try(site)
    assert res.exit_code == 1
    lines = res.stdout.splitlines()
    assert lines[0] == ("the site would refuse this fit: setup: 1 client (below); nothing of "
                        "this exchange was used")
    assert lines[1] == ("  site 'hospital-a' refused (privacy.required): the fit is not "
                        "differentially private; fix: fit with --privacy epsilon=E,delta=D,"
                        "clip=C")
    assert "1 ledger entries this fit would write" in res.stdout
    assert not (site / "site-a").exists()  # a dry run: the site's ledger is not touched


def test_site_try_answers_within_the_policy_and_lists_its_releases(site):
    res = _try(site, "--privacy", "epsilon=0.5,delta=1e-6,clip=5")
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith("the site would answer this fit (2 rounds on 200 rows of 1 "
                                 "client(s))")
    releases = [ln for ln in res.stdout.splitlines() if " release " in ln]
    assert len(releases) == 4  # two start releases and two rounds: the private plan
    assert "release 4/4 eps_run=0.5 " in releases[-1]
    assert not (site / "site-a").exists()


def test_site_try_counts_the_releases_of_the_sites_ledger_and_says_what_remains(site):
    from fedlatent.engine.site.policy import SitePolicy

    policy = SitePolicy.load(site / "policy.toml")
    fd = fl.FederatedDataset.from_pandas(pd.read_csv(site / "mine.csv").assign(c="a"), client="c")
    dp = fl.DifferentialPrivacy(0.9, 1e-6, clip=5.0)
    fl.FederatedGaussianMixture(2, random_state=0, federation=fl.Federation(privacy=dp)).fit(
        fd, runtime=fl.InProcessRuntime(fd, policies={"a": policy}))
    ledger = (site / "site-a" / LEDGER_FILE).read_bytes()
    res = _try(site, "--privacy", "epsilon=0.5,delta=1e-6,clip=5")
    assert res.exit_code == 1
    line = res.stdout.splitlines()[1]
    assert line.startswith("  site 'hospital-a' refused (privacy.lifetime-epsilon): this plan "
                           "would bring data set 'default' to epsilon=")
    spent = float(line.split("(spent so far ")[1].split(")")[0])
    assert spent == pytest.approx(0.9, abs=1e-3)
    assert f"; {1.0 - spent:.4g} remains; fix: ask for a smaller epsilon" in line
    assert (site / "site-a" / LEDGER_FILE).read_bytes() == ledger  # untouched


def test_site_ledger_full_shows_every_fix_whole(site):
    from fedlatent.engine.site.policy import SitePolicy

    policy = SitePolicy.load(site / "policy.toml")
    fd = fl.FederatedDataset.from_pandas(pd.read_csv(site / "mine.csv").assign(c="a"), client="c")
    with pytest.raises(fl.engine.faults.FederatedFitError):
        fl.FederatedGaussianMixture(2, random_state=0).fit(
            fd, runtime=fl.InProcessRuntime(fd, policies={"a": policy}))
    reason = Ledger(site / "site-a", "hospital-a").entries[-1]["reason"]
    assert len(reason) > 110
    cut = runner.invoke(app, ["site", "ledger", str(site / "site-a")])
    full = runner.invoke(app, ["site", "ledger", str(site / "site-a"), "--full"])
    assert cut.exit_code == 0 and full.exit_code == 0, cut.output + full.output
    assert reason not in cut.stdout and "…" in cut.stdout
    assert reason in full.stdout and "…" not in full.stdout


def test_site_help_is_plain_and_whole(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    res = runner.invoke(app, ["site", "--help"])
    assert res.exit_code == 0
    listing = res.stdout.split("Commands:")[1]
    assert "╭" not in res.stdout and "..." not in listing and "…" not in listing
    for name in ("check", "ledger", "report", "keygen", "roster", "try"):
        assert f"\n  {name} " in res.stdout, name
