"""The site policy file: read from TOML, every key checked, errors naming the key (issue 21);
``fedlatent site check``, ``site ledger`` and ``site report`` on the command line."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import fedlatent as fl
from fedlatent.cli import app
from fedlatent.engine.privacy import DifferentialPrivacy
from fedlatent.engine.rounds.loop import FederatedFitError
from fedlatent.engine.site import SitePolicy
from fedlatent.engine.site.policy import PolicyError
from fedlatent.engine.transport.inprocess import InProcessRuntime

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "site-policy.toml"


def test_the_documented_example_loads_with_every_floor():
    p = SitePolicy.load(EXAMPLE)
    assert (p.name, p.simulation, p.directory) == ("hospital-a", False, EXAMPLE.parent / "site")
    assert (p.disclosure.min_records, p.disclosure.tree_min_leaf) == (5, 5)
    assert (p.privacy_required, p.max_epsilon, p.max_delta) == (True, 1.0, 1e-5)
    assert (p.lifetime_epsilon, p.lifetime_delta) == (3.0, 1e-5)
    assert p.models == ("gmm", "lcr") and p.exchanges is None
    assert p.datasets == {"study": EXAMPLE.parent / "data" / "study.parquet"}
    assert (p.sec_evaluate_others, p.sec_trusted_types) == (False, ("linear",))
    assert (p.max_message_bytes, p.max_rounds, p.max_releases) == (50_000_000, 200, 200)
    assert (p.roster, p.signing_key) == (EXAMPLE.parent / "roster.json", None)  # pinned


def test_roster_and_signing_key_are_paths_beside_the_file(tmp_path):
    f = tmp_path / "p.toml"
    f.write_text('[site]\nroster = "keys/roster.toml"\nsigning_key = "/abs/site.key"\n')
    p = SitePolicy.load(f)
    assert (p.roster, p.signing_key) == (tmp_path / "keys" / "roster.toml", Path("/abs/site.key"))


def test_no_table_is_the_default_floor():
    p = SitePolicy.from_dict({})
    assert p.disclosure == fl.DisclosurePolicy() and not p.privacy_required
    assert p.lifetime_epsilon is None and p.datasets == {}


@pytest.mark.parametrize(("text", "message"), [
    ("[privacy]\nmax-epsilom = 1\n", r"unknown key\(s\) \['privacy.max-epsilom'\]; known in "
                                     r"\[privacy\]: \['lifetime-delta', 'lifetime-epsilon', "
                                     r"'max-delta', 'max-epsilon', 'required'\]"),
    ("[privacy]\nmax-epsilon = -1\n", r"privacy.max-epsilon must be a positive number, got -1"),
    ("[privacy]\nlifetime-delta = 2.0\n", r"privacy.lifetime-delta must be in \(0, 1\), got 2.0"),
    ("[privacy]\nrequired = \"yes\"\n", r"privacy.required must be true or false, got 'yes'"),
    ("[limits]\nmax-rounds = 0\n", r"limits.max-rounds must be an integer >= 1, got 0"),
    ("[disclosure]\nmin_records = -2\n", r"\[disclosure\]: DisclosurePolicy: min_records must "
                                         r"be an integer >= 0, got -2"),
    ("[answer]\nmodels = \"gmm\"\n", r"answer.models must be a list of names, got 'gmm'"),
    ("[priv]\n", r"unknown table\(s\) \['priv'\]"),
    ("privacy = 3\n", r"\[privacy\] must be a table, got 3"),
    ("[datasets]\n\"../x\" = \"a.csv\"\n", r"datasets.../x: a data set's name is a plain name"),
    ("[privacy\n", r"not valid TOML"),
], ids=["unknown-key", "negative", "delta", "bool", "limit", "disclosure", "list", "table",
        "not-a-table", "dataset-name", "toml"])
def test_a_bad_file_is_refused_naming_the_file_and_the_key(tmp_path, text, message):
    f = tmp_path / "site.toml"
    f.write_text(text)
    with pytest.raises(PolicyError, match=rf"^site policy {f}: {message}"):
        SitePolicy.load(f)


def test_inf_in_the_disclosure_table_is_infinity():
    p = SitePolicy.from_dict({"disclosure": {"max_levels_density": "inf"}})
    assert math.isinf(p.disclosure.max_levels_density)


# ---- the command line ---------------------------------------------------------------------------
def test_site_check_prints_the_floors_and_exits_2_on_a_bad_file(tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["site", "check", str(EXAMPLE)])
    assert res.exit_code == 0, res.output
    assert "a valid site policy" in res.output
    assert "privacy.lifetime-epsilon               3.0" in res.output
    bad = tmp_path / "bad.toml"
    bad.write_text("[limits]\nmax-rounds = 0\n")
    res = runner.invoke(app, ["site", "check", str(bad)])
    assert res.exit_code == 2
    assert f"error: site policy {bad}: limits.max-rounds must be an integer >= 1" in res.output


def test_site_ledger_and_report_show_what_left_the_site(tmp_path):
    rng = np.random.default_rng(0)
    fd = fl.FederatedDataset.from_arrays(
        {f"c{i}": rng.normal(size=(40, 2)) * 3 + i for i in range(3)})
    rt = InProcessRuntime(fd, policies=SitePolicy(directory=tmp_path, max_epsilon=2.0))
    est = fl.FederatedGaussianMixture(2, random_state=0, max_rounds=2, federation=fl.Federation(
        privacy=DifferentialPrivacy(1.0, 1e-5, clip=5.0)))
    est.fit(fd, runtime=rt)
    with pytest.raises(FederatedFitError, match=r"privacy.max-epsilon"):
        est.set_params(federation=fl.Federation(
            privacy=DifferentialPrivacy(3.0, 1e-5, clip=5.0))).fit(fd, runtime=rt)
    site = tmp_path / "site-c0"
    runner = CliRunner()
    res = runner.invoke(app, ["site", "ledger", str(site)])
    assert res.exit_code == 0, res.output
    kinds = [ln.split()[3] for ln in res.output.splitlines()[2:-1]]
    assert kinds == ["plan"] + ["release", "answer"] * 3 + ["answer"] + ["release", "answer"] \
        + ["refusal"]  # moments, hard assignments, round 1, cv_init, round 2; the 2nd fit
    assert "release 4/4 eps_run=0.9999 delta=1e-05 records=40" in res.output
    assert "[privacy.max-epsilon] site 'c0' refused" in res.output
    assert "11 entries; hash chain verified" in res.output
    res = runner.invoke(app, ["site", "report", str(site)])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    first = next(ln for ln in lines if ln.startswith("FederatedGaussianMixture-"))
    assert first.split()[1:4] == ["default", "gmm", "cv_init"]
    assert first.split()[-4:] == ["4/4", "0.9999", "0", "-"]
    second = [ln for ln in lines if ln.startswith("FederatedGaussianMixture-")][1]
    assert second.split()[-5:] == ["0", "0", "1", "privacy.max-epsilon", "x1"]
    assert any(ln.startswith("default   4 ") for ln in lines)
    (site / "ledger.jsonl").write_text((site / "ledger.jsonl").read_text().replace(
        '"records":40', '"records":4', 1))
    res = runner.invoke(app, ["site", "ledger", str(site)])
    assert res.exit_code == 2 and "the hash chain is broken" in res.output
