"""``flower local`` (issue 41): its result as good as ``fit``'s (roles.json, the summary, the
same warnings), and a site operator's path on the command line alone: one policy file per
site, the refusal in the command line's words, the ledger read with ``site ledger``."""

import json
import warnings

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import fedlatent as fl
from fedlatent.cli import app

runner = CliRunner()


def _table(path):
    rng = np.random.default_rng(0)
    df = pd.DataFrame(np.vstack([rng.normal(size=(90, 2)), rng.normal(3, 1, size=(90, 2))]),
                      columns=["x1", "x2"])
    df["site"] = np.tile(["a", "b", "c"], 60)
    df.to_csv(path, index=False)
    return path


def test_the_result_of_flower_local_is_read_and_reported_as_fit_reports_its_own(tmp_path):
    """The end of ``flower local`` on a server's result directory (an in-process fit saved as
    the server app saves it, its warnings recorded as the server app records them) prints
    the lines ``fit`` prints and writes the same roles.json, so ``predict`` needs no
    --client."""
    pytest.importorskip("flwr")
    from fedlatent.cli import flower_run
    from fedlatent.engine.contract.registry import estimator_entries
    from fedlatent.runtime.flower import _recorded

    data = _table(tmp_path / "d.csv")
    args = ["-k", "2", "--max-rounds", "3", "--covariance-type", "diag", "--tol", "1e-9"]
    fit = runner.invoke(app, ["fit", "gmm", "--data", str(data), "--client", "site",
                              *args, "--out", str(tmp_path / "fit")])
    assert fit.exit_code == 0, fit.output

    fd = fl.FederatedDataset.from_pandas(pd.read_csv(data), client="site")
    est = fl.FederatedGaussianMixture(2, max_rounds=3, covariance_type="diag", tol=1e-9,
                                      random_state=0)
    result = tmp_path / "out" / "result"
    result.mkdir(parents=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        est.fit(fd)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        status = {"status": "ok", "rounds": 3, "seconds_per_round": 1.5,
                  "warnings": _recorded(caught)}
    est.save(result / "model")
    (result / "status.json").write_text(json.dumps(status))
    sites = flower_run.Sites(files=[], ids=fd.client_ids, n_samples=fd.n_samples,
                             n_features=fd.n_features,
                             roles={"estimator": "gmm", "client": "site", "target": None,
                                    "entity": None, "features": ["x1", "x2"]})
    local = CliRunner().invoke(_finishing(flower_run, estimator_entries()["gmm"], result, sites))
    assert local.exit_code == 0, local.output
    fit_lines = fit.stdout.splitlines()[:-1]  # but the files written
    assert local.stdout.splitlines()[1:-1] == fit_lines
    assert local.stdout.splitlines()[0] == "every Flower process stopped; 3 rounds, 1.5 s per round"
    assert local.stderr == fit.stderr  # the same ConvergenceWarning, in the same words
    assert "raise --max-rounds or --tol" in local.stderr
    assert json.loads((result / "roles.json").read_text()) == json.loads(
        (tmp_path / "fit" / "roles.json").read_text())
    pred = runner.invoke(app, ["predict", "--model", str(result), "--data", str(data),
                               "--out", str(tmp_path / "p.csv")])
    assert pred.exit_code == 0, pred.output


def _finishing(flower_run, entry, result, sites):
    """A one-command typer app running ``flower_run._finish`` (as the end of ``flower local``
    does), under the command line's handling of warnings."""
    import typer

    from fedlatent.cli.common import user_errors

    one = typer.Typer()

    @one.command()
    def finish():
        with user_errors():
            flower_run._finish(entry, result, sites)

    return one


POLICIES = {
    "a": '[site]\nname = "hospital-a"\ndirectory = "ledger-a"\n[privacy]\nrequired = true\n',
    "b": '[site]\nname = "hospital-b"\ndirectory = "ledger-b"\n[answer]\nmodels = ["lcr"]\n',
}


@pytest.mark.flower
@pytest.mark.deployment
@pytest.mark.slow
def test_a_site_operator_runs_flower_local_with_a_policy_per_site_and_reads_its_ledger(
        tmp_path):
    """A real loopback deployment of three sites, two with a policy file that refuses the fit
    at its setup (so the run is short): the command line names each refusal with its fix as
    an option and where each site's ledger is, and ``site ledger`` reads it."""
    pytest.importorskip("flwr")
    data = _table(tmp_path / "d.csv")
    for site, text in POLICIES.items():
        (tmp_path / f"{site}.toml").write_text(text)
    res = runner.invoke(app, ["flower", "local", "gmm", "--data", str(data), "--client", "site",
                              "-k", "2", "--max-rounds", "2", "--node-wait", "300",
                              "--site-policy", f"a={tmp_path / 'a.toml'}",
                              "--site-policy", f"b={tmp_path / 'b.toml'}",
                              "--out", str(tmp_path / "out")])
    assert res.exit_code == 2, res.output
    lines = res.stderr.splitlines()
    assert lines[0] == ("note: flower local runs on 127.0.0.1 without TLS or SuperNode "
                        "authentication (loopback only); for a deployment across machines use "
                        "'flower partition'")
    err = lines[1:]
    assert err[0] == ("error: setup: 2 of 3 clients refused by a disclosure rule or their own "
                      "policy, leaving 1, fewer than --min-clients 2: 2 clients (below)")
    assert err[1] == ("  client 'a': site 'hospital-a' refused (privacy.required): the fit is "
                      "not differentially private; fix: fit with --privacy epsilon=E,delta=D,"
                      "clip=C")
    assert err[2] == ("  client 'b': site 'hospital-b' refused (answer.models): model 'gmm' is "
                      "not one it answers; fix: fit one of ['lcr'], or ask the site's operator")
    ledger = tmp_path / "ledger-a"
    assert f"site 'a': its ledger is {ledger} (fedlatent site ledger {ledger})" in err
    read = runner.invoke(app, ["site", "ledger", str(ledger), "--full"])
    assert read.exit_code == 0, read.output
    rows = [ln for ln in read.stdout.splitlines() if " refusal " in ln]
    assert len(rows) == 1 and rows[0].endswith(
        "fix: fit with Federation(privacy=DifferentialPrivacy(...))")  # the record, as kept
    assert read.stdout.splitlines()[-1] == "1 entries; hash chain verified"
    assert not (tmp_path / "out" / "result" / "model.json").exists()
