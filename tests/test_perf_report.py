"""benchmarks/report.py writes the README's performance block and docs/benchmarks/performance.md:
the block between the markers and nothing else, a dated machine header, every benchmark's
printed tables as they are, and a failed benchmark as failed (tiny fake benchmark scripts)."""

from __future__ import annotations

import importlib.util
import re
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEADER = re.compile(r"Measured \d{4}-\d\d-\d\d \d\d:\d\d UTC on .+ \(\d+ cores, load average "
                    r"[\d.]+ at the end\), Python 3\.\d+\.\d+, fedlatent \S+, NumPy \S+, "
                    r"scikit-learn \S+; written by `python benchmarks/report\.py` in \d+ min\.")


def load_report():
    spec = importlib.util.spec_from_file_location("perf_report", ROOT / "benchmarks" / "report.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


report = load_report()

README = """# project

Intro text.

## Performance

Static sentence.

<!-- performance:begin -->
OLD NUMBERS 9.99 from another day
<!-- performance:end -->

## After

Trailing text.
"""

FAKES = {
    "md.py": """
        print("progress line that is no table")
        print("caption of the first table")
        print("| a | b |")
        print("|---|---|")
        print("| 1 | 2.50 |")
        print()
        print("final table: rounds")
        print("| case | ratio |")
        print("|---|---|")
        print("| GMM | 0.31 |")
    """,
    "fixed.py": """
        print("clients  setup s   ratio")
        print("     10     0.12    1.93")
    """,
    "broken.py": """
        import sys
        print("| half | a table |")
        print("Traceback: something broke in the fake benchmark", file=sys.stderr)
        sys.exit(3)
    """,
    "ratio_ok.py": """
        print("data: 5 clients")
        print("ours: 0.200 s")
        print("theirs: 0.400 s")
        print("ratio: 0.50")
    """,
    "ratio_bad.py": """
        print("data: 5 clients")
        print("nothing else")
    """,
}


def fakes(tmp_path):
    """The fake scripts in tmp_path, as the report's Script and Bench entries."""
    for name, code in FAKES.items():
        (tmp_path / name).write_text(textwrap.dedent(code), encoding="utf-8")
    scripts = tuple(report.Script(title, f"what {title}", str(tmp_path / name), ("--q",),
                                  ("--f",))
                    for title, name in (("Markdown bench", "md.py"), ("Fixed bench", "fixed.py"),
                                        ("Broken bench", "broken.py")))
    benches = tuple(report.Bench(title, str(tmp_path / name), (), "the reference",
                                 r"^ours: ([\d.]+)", r"^theirs: ([\d.]+)", r"^ratio: ([\d.]+)")
                    for title, name in (("Ratio ok", "ratio_ok.py"),
                                        ("Ratio bad", "ratio_bad.py")))
    return scripts, benches


def block_of(text):
    return text.split("<!-- performance:begin -->\n", 1)[1].split("<!-- performance:end -->")[0]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """One report run over the fake scripts: (README before, README after, page)."""
    tmp = tmp_path_factory.mktemp("perf")
    scripts, benches = fakes(tmp)
    readme, out = tmp / "README.md", tmp / "docs" / "performance.md"
    readme.write_text(README, encoding="utf-8")
    report.main(["--out", str(out), "--readme", str(readme)], scripts=scripts, benches=benches)
    return README, readme.read_text(encoding="utf-8"), out.read_text(encoding="utf-8")


def test_the_writer_replaces_exactly_the_marked_block_and_nothing_else(written):
    before, after, _ = written
    head, tail = before.split("OLD NUMBERS 9.99 from another day\n")
    assert after.startswith(head) and after.endswith(tail)
    assert "OLD NUMBERS" not in after
    assert after.count("<!-- performance:begin -->") == after.count("<!-- performance:end -->") == 1


def test_the_block_and_the_page_start_with_the_date_the_machine_and_the_command(written):
    _, after, page = written
    assert HEADER.match(block_of(after))
    assert HEADER.match(page)
    date = re.search(r"Measured (\S+ \S+) UTC", page)[1]
    assert f"Measured {date} UTC" in block_of(after)  # one run, one date


def test_the_readme_gets_each_final_table_and_the_page_every_table(written):
    _, after, page = written
    block = block_of(after)
    assert "final table: rounds\n\n| case | ratio |\n|---|---|\n| GMM | 0.31 |" in block
    assert "caption of the first table" not in block
    assert "caption of the first table\n\n| a | b |\n|---|---|\n| 1 | 2.50 |" in page
    assert "| GMM | 0.31 |" in page and "progress line" not in page
    # no Markdown row printed: the whole output as a text block
    assert "```text\nclients  setup s   ratio\n     10     0.12    1.93\n```" in block
    assert "`python md.py --q`" in page and "what Markdown bench" in page


def test_a_failed_benchmark_is_written_as_failed_without_its_partial_output(written):
    _, after, page = written
    block = block_of(after)
    assert re.search(r"\*\*Broken bench\*\* \(`python broken\.py --q`, \d+ s\)\n\n\*\*failed"
                     r"\*\*: exit code 3 after \d+ s\.\n\n```text\nTraceback: something broke in "
                     r"the fake benchmark\n```", block)
    assert re.search(r"### Broken bench\n\n`python broken\.py --q`, \d+ s: what Broken bench\."
                     r"\n\n\*\*failed\*\*: exit code 3 after \d+ s\.\n\n```text\nTraceback: "
                     r"something broke in the fake benchmark\n```", page)
    for text in (block, page):
        assert "| half | a table |" not in text
        assert re.search(r"\| Ratio ok \(`\S*ratio_ok\.py`\) \| 5 clients \| 0\.200 \| the "
                         r"reference \| 0\.400 \| 0\.50 \| \d+ \|", text)
        assert re.search(r"\| Ratio bad \(`\S*ratio_bad\.py`\) \| \*\*failed\*\*: \S*ratio_bad"
                         r"\.py: no line matching .* \| failed \| \d+ \|", text)


def test_a_benchmark_past_its_timeout_is_stopped_and_failed(tmp_path):
    script = tmp_path / "slow.py"
    script.write_text("import time\nprint('| x |')\ntime.sleep(60)\n", encoding="utf-8")
    run = report.execute(script, (), timeout=0.5)
    assert run.error == "timed out after 0 s" and run.seconds < 30
    lines = report.section(report.Script("Slow", "w", str(script), ()), run, False, brief=True)
    assert lines[2] == "**failed**: timed out after 0 s."


def test_a_readme_without_its_markers_is_refused_before_any_benchmark_runs(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# project\n<!-- performance:end -->\n<!-- performance:begin -->\n",
                      encoding="utf-8")
    with pytest.raises(ValueError, match=r"README\.md: expected one <!-- performance:begin --> "
                                         r"line, then one <!-- performance:end --> line"):
        report.main(["--readme", str(readme), "--out", str(tmp_path / "p.md")],
                    scripts=(report.Script("never", "w", str(tmp_path / "absent.py"), ()),),
                    benches=())
    assert not (tmp_path / "p.md").exists()


def test_the_repository_readme_carries_no_dated_measurements_and_a_run_leaves_it(tmp_path):
    """The benchmarks page is the one with dated measurements: the README links it, and a
    report run without --readme writes the page only."""
    readme = ROOT / "README.md"
    text = readme.read_text(encoding="utf-8")
    assert "<!-- performance:begin -->" not in text and "docs/benchmarks.md" in text
    scripts, benches = fakes(tmp_path)
    report.main(["--out", str(tmp_path / "p.md")], scripts=scripts, benches=benches)
    assert (tmp_path / "p.md").exists() and readme.read_text(encoding="utf-8") == text


def test_the_privacy_table_prints_epsilon_one_as_markdown_rows(monkeypatch, capsys):
    import types

    import numpy as np
    import pandas as pd

    # the experiment's module replaced by one with a fake function (no import, no fit)
    module = types.ModuleType("fedlatent.experiments.privacy_utility")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    asked = {}

    def fake(**kw):
        asked.update(kw)
        table = pd.DataFrame({
            "model": ["FederatedGaussianMixture", "FederatedGaussianMixture", "LCR"],
            "metric": ["heldout_loglik", "heldout_loglik", "mse"],
            "n_records": [100_000, 100_000, 100_000], "epsilon": [np.inf, 1.0, 1.0],
            "value": [-3.5, -3.521, 0.2625], "nonprivate": [-3.5, -3.5, 0.25],
            "relative_loss": [0.0, 0.006, 0.05], "n_seeds": [3, 3, 3], "failed": [0, 0, 1]})
        table.attrs["settings"] = {"delta": 1e-5, "noise": "distributed", "n_clients": 10,
                                   "max_rounds": 10}
        table.attrs["skipped"] = {"SEC": "no DP"}
        return table

    module.privacy_utility = fake
    report.main(["--privacy-table", "--full"])
    out = capsys.readouterr().out.splitlines()
    assert asked == {"epsilons": (1.0,), "max_rounds": None, "sizes": (100_000,), "n_seeds": 3}
    assert out[0] == ("epsilon 1, delta 1e-05, distributed noise, 10 clients, rounds: 10; "
                      "held-out metric of the private and the non-private fit on the same data "
                      "and seeds; SEC skipped (no DP)")
    assert out[3:] == [
        "| FederatedGaussianMixture | heldout_loglik | 100,000 | 3 | -3.5210 | -3.5000 | 0.60% "
        "| 0 |",
        "| LCR | mse | 100,000 | 3 | 0.2625 | 0.2500 | 5.00% | 1 |"]


def test_a_failure_shows_the_end_of_its_error_output_cut_to_a_readable_width():
    run = report.Run(2.0, "| partial |", "first\n" + "x" * 1000 + "\n", "exit code 1 after 2 s")
    assert report.failure(run, 1) == ["**failed**: exit code 1 after 2 s.", "", "```text",
                                      "x" * 396 + " ...", "```"]
    assert report.failure(run, 12)[3] == "first"
