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
from site_example import example_sites

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "site-policy.toml"


def test_the_documented_example_loads_with_every_floor():
    p = SitePolicy.load(EXAMPLE)
    assert (p.name, p.simulation, p.directory) == ("", False, EXAMPLE.parent / "site")
    assert p.witness == EXAMPLE.parent / "witness" and p.signing_key is not None
    assert p.roster == EXAMPLE.parent / "roster.json"  # pinned: issue 37
    assert (p.disclosure.min_records, p.disclosure.tree_min_leaf) == (5, 5)
    assert (p.privacy_required, p.verified_suffices) == (True, True)
    assert (p.max_epsilon, p.max_delta) == (1.0, 1e-5)
    assert (p.lifetime_epsilon, p.lifetime_delta) == (3.0, 1e-5)
    assert p.models == ("gmm", "lcr") and p.exchanges is None
    assert p.datasets == {"study": EXAMPLE.parent / "data" / "study.parquet"}
    assert (p.sec_evaluate_others, p.sec_trusted_types) == (False, ("linear",))
    assert (p.max_message_bytes, p.max_rounds, p.max_releases) == (50_000_000, 200, 200)


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
    ("[privacy]\nrequired = \"yes\"\n",
     r"privacy.required must be true, false or 'dp-or-verified', got 'yes'"),
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
    res = runner.invoke(app, ["site", "check", str(EXAMPLE)])  # its files are not there
    assert res.exit_code == 2 and "data/study.parquet: no such file" in res.output
    example = example_sites(tmp_path, ["c0"])["c0"]
    res = runner.invoke(app, ["site", "check", str(example)])
    assert res.exit_code == 0, res.output
    assert "warning" not in res.output and "a valid site policy" in res.output
    assert "privacy.required                       dp-or-verified" in res.output
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


# ---- written wrong (issue 39, item 3) --------------------------------------------------------
@pytest.mark.parametrize(("text", "message"), [
    ("[privacy]\nmax-epsilon = 1.0\nmax_epsilon = 100.0\n",
     r"privacy.max-epsilon is written twice \('max-epsilon' and 'max_epsilon'\); keep one"),
    ("[secure-aggregation]\nrequired = true\n[secure_aggregation]\nrequired = false\n",
     r"\[secure_aggregation\] is written twice"),
    ("[privacy]\nlifetime-delta = 1e-5\n",
     r"privacy.lifetime-delta without privacy.lifetime-epsilon sets no budget; give both"),
    ("[privacy]\nlifetime-epsilon = 3.0\n",
     r"privacy.lifetime-epsilon without privacy.lifetime-delta: the budget would be counted at "
     r"each fit's own delta, which the server chooses"),
    ('[datasets]\na = "x.csv"\nb = "./x.csv"\n',
     r"datasets.a and datasets.b name the same file .*x.csv; a data set has one name"),
], ids=["key-twice", "table-twice", "delta-alone", "epsilon-alone", "one-file-two-names"])
def test_a_file_written_ambiguously_is_refused(tmp_path, text, message):
    f = tmp_path / "site.toml"
    f.write_text(text)
    with pytest.raises(PolicyError, match=rf"^site policy {f}: {message}"):
        SitePolicy.load(f)


def test_site_check_lists_every_mistake_of_a_file_at_once(tmp_path):
    f = tmp_path / "site.toml"
    f.write_text('[site]\nroster = "roster.json"\n[disclosure]\nmin_records = 1\n'
                 "[privacy]\nmax-epsilon = 2.0\nlifetime-epsilon = 1.0\nlifetime-delta = 1e-5\n"
                 '[answer]\nmodels = ["gmm", "gmmm"]\n[datasets]\nstudy = "study.csv"\n')
    res = CliRunner().invoke(app, ["site", "check", str(f)])
    assert res.exit_code == 2
    errors = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert [e.split(": ", 2)[2] for e in errors] == [
        f"site.roster = {tmp_path / 'roster.json'}: no such file",
        f"datasets.study = {tmp_path / 'study.csv'}: no such file",
        "answer.models: unknown model 'gmmm'; known: " + errors[2].split("known: ")[1],
        "privacy.lifetime-epsilon = 1 is below the per-fit privacy.max-epsilon = 2: a fit at "
        "the ceiling could never run; raise lifetime-epsilon or lower max-epsilon",
        "[disclosure] is below the library's default floor: min_records=1 (floor 3); a site "
        "protects less than a node without a policy file (remove the key, or raise it)"]
    assert "'gmm'" in errors[2] and "a valid site policy" not in res.output
    assert ("warning: no site.witness: restoring a backup of the site directory resets its "
            "ledger") in res.output
    # the same file put right passes
    (tmp_path / "roster.json").write_text("{}")
    (tmp_path / "study.csv").write_text("x\n1\n")
    f.write_text('[site]\nroster = "roster.json"\ndirectory = "site"\nwitness = "../witness"\n'
                 "[privacy]\nmax-epsilon = 1.0\nlifetime-epsilon = 3.0\nlifetime-delta = 1e-5\n"
                 '[answer]\nmodels = ["gmm"]\n[datasets]\nstudy = "study.csv"\n')
    res = CliRunner().invoke(app, ["site", "check", str(f)])
    assert res.exit_code == 0, res.output
    assert "a valid site policy" in res.output and "warning" not in res.output
    f.write_text('[site]\ndirectory = "site"\nwitness = "site/witness"\n')
    res = CliRunner().invoke(app, ["site", "check", str(f)])
    assert res.exit_code == 2 and "site.witness = " in res.output
    assert "is inside site.directory: a backup of the site directory would restore it too" \
        in res.output
