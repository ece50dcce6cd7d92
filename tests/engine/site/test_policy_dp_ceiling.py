"""``fedlatent site check`` warns when a policy requires privacy (DP or verified secure
aggregation) without a DP ceiling: any epsilon then meets it, and a DP fit's start and
saturation rule are left to the noise."""

from typer.testing import CliRunner

from fedlatent.cli import app
from fedlatent.engine.site.policy import SitePolicy

WARNING = "privacy.required without privacy.max-epsilon"


def _warnings(table: dict) -> list[str]:
    return SitePolicy.from_dict(table).problems()[1]


def test_required_privacy_without_a_ceiling_is_warned_about():
    for required in (True, "dp-or-verified"):
        assert any(w.startswith(WARNING) for w in _warnings({"privacy": {"required": required}}))


def test_a_ceiling_or_no_requirement_gives_no_such_warning():
    assert not any(w.startswith(WARNING) for w in _warnings(
        {"privacy": {"required": "dp-or-verified", "max-epsilon": 1.0}}))
    assert not any(w.startswith(WARNING) for w in _warnings({}))


def test_site_check_prints_it(tmp_path):
    path = tmp_path / "policy.toml"
    path.write_text('[privacy]\nrequired = "dp-or-verified"\n')
    out = CliRunner().invoke(app, ["site", "check", str(path)])
    assert out.exit_code == 0, out.output
    assert f"warning: {WARNING}" in " ".join(out.output.split())
