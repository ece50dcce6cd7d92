"""``fedlatent site check`` and ``site report`` say plainly when a fit trusts the server with the
site's records (issue 38): with neither differential privacy nor verified secure aggregation,
a server that crafts the parameters it sends can rebuild them."""

from __future__ import annotations

from typer.testing import CliRunner

from fedlatent.cli import app
from fedlatent.cli.site import TRUSTS_SERVER
from site_example import example_sites


def test_a_policy_without_required_privacy_is_told_it_trusts_the_server(tmp_path):
    f = tmp_path / "site.toml"
    f.write_text('[site]\ndirectory = "site"\n')
    res = CliRunner().invoke(app, ["site", "check", str(f)])
    assert res.exit_code == 0, res.output
    assert TRUSTS_SERVER in res.output


def test_the_example_policy_requiring_dp_or_verified_is_not(tmp_path):
    example = example_sites(tmp_path, ["c0"])["c0"]
    res = CliRunner().invoke(app, ["site", "check", str(example)])
    assert res.exit_code == 0, res.output
    assert "trusts the server" not in res.output


def test_site_report_names_the_runs_with_neither_dp_nor_verified_rounds(tmp_path):
    import warnings

    import numpy as np

    import fedlatent as fl
    from fedlatent.engine.site.policy import SitePolicy

    rng = np.random.default_rng(0)
    fd = fl.FederatedDataset.from_arrays({f"c{i}": rng.normal(size=(40, 2)) for i in range(3)})
    policy = SitePolicy(directory=tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for secure in (True, False):  # verified (the default under secure aggregation), plain
            fl.FederatedGaussianMixture(2, max_rounds=2, random_state=0, verbose=False,
                                        federation=fl.Federation(secure_aggregation=secure)
                                        ).fit(fd, runtime=fl.InProcessRuntime(fd,
                                                                              policies=policy))
    res = CliRunner().invoke(app, ["site", "report", str(tmp_path / "site-c0")])
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "note: 1 run(s) had neither differential privacy nor verified secure aggregation" \
        in text
    assert "they trusted the server with this site's records" in text
