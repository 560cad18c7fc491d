"""By data source in `rlotel report` and `rlotel compare`: real telemetry writes a real traces
file, the real report and compare read it back. Means over steps weigh each step by its
samples (Σ sum ÷ Σ count, verl #3785): the inputs are chosen so that the mean of the per-step
means is far from it, and the expected figures are computed here with numpy from the
inputs, not from what rlotel recorded."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import rlotel
from rlotel.cli import commands as cli
from rlotel.offline import compare
from rlotel.offline.report import write_report
from tests.test_report import page_data

# A step: (data source, reward, response tokens, generate seconds) per sample, interleaved.
# Rewards are multiples of 1/4: every sum is exact, so the means can be compared with ==.
STEP_1 = [
    ("math", 1.0, 100, 0.10), ("code", 0.0, 400, 0.90), ("math", 1.0, 120, 0.12),
    ("math", 1.0, 110, 0.11), ("math", 0.5, 130, 0.30), ("code", 0.0, 420, 1.10),
    ("math", 1.0, 90, 0.09), ("math", 0.5, 150, 0.25),
]  # fmt: skip  # math 6 samples, code 2
STEP_2 = [
    ("code", 1.0, 300, 0.70), ("math", 0.0, 500, 0.80), ("code", 1.0, 310, 0.75),
    ("code", 1.0, 290, 0.65), ("code", 1.0, 305, 0.72), ("math", 0.25, 520, 0.85),
    ("code", 1.0, 280, 0.60), ("code", 0.5, 330, 0.95),
]  # fmt: skip  # math 2 samples, code 6
STEP_3 = [("math", 0.75, 200, 0.20), ("math", 0.25, 210, 0.22), ("math", 0.5, 190, 0.18)]
RUN = [STEP_1, STEP_2, STEP_3]


def write_run(path: Path, steps: list[list[tuple]], name: str = "sources") -> None:
    """A real traces file: each step's samples recorded in its `gen` phase."""
    tel = rlotel.init(run=name, prometheus_port=None, traces_file=path)
    for number, samples in enumerate(steps, start=1):
        with tel.step(number), tel.phase("gen"):
            sources, rewards, lengths, seconds = (list(c) for c in zip(*samples, strict=True))
            tel.record_samples(
                generate_sequences=seconds,
                response_length=lengths,
                reward=rewards,
                data_source=sources,
            )
    tel.shutdown()


def expected(steps: list[list[tuple]], source: str) -> dict:
    """One source's figures over `steps`, from the inputs (numpy)."""
    per_step = [[s for s in step if s[0] == source] for step in steps]
    per_step = [rows for rows in per_step if rows]
    rewards = np.array([s[1] for rows in per_step for s in rows])
    lengths = np.array([s[2] for rows in per_step for s in rows], dtype=float)
    p90s = [np.percentile(np.array([s[3] for s in rows]), 90) for rows in per_step]
    last = np.array([s[1] for s in per_step[-1]])
    return {
        "steps": len(per_step),
        "samples": rewards.size,
        "reward_mean": float(np.mean(rewards)),  # every sample weighs the same
        "mean_of_means": float(np.mean([np.mean([s[1] for s in rows]) for rows in per_step])),
        "response_mean": float(np.mean(lengths)),
        "response_mean_of_means": float(np.mean([np.mean([s[2] for s in r]) for r in per_step])),
        "generate_p90_s": float(np.median(p90s)),
        "last_reward_mean": float(np.mean(last)),
    }


def test_report_by_data_source_weighs_each_step_by_its_samples(tmp_path) -> None:
    traces = tmp_path / "traces.jsonl"
    write_run(traces, RUN)
    data = page_data(write_report(traces, tmp_path / "report.html").path)
    rows = {row["name"]: row for row in data["data_sources"]}
    assert [row["name"] for row in data["data_sources"]] == ["math", "code"]  # most samples first
    total = sum(len(step) for step in RUN)
    for source in ("math", "code"):
        want, row = expected(RUN, source), rows[source]
        # the inputs tell the two means apart by far: the test can see which one is shown
        assert abs(want["reward_mean"] - want["mean_of_means"]) > 0.1
        assert abs(want["response_mean"] - want["response_mean_of_means"]) > 20
        assert row["steps"] == want["steps"] and row["samples"] == want["samples"]
        assert row["share"] == pytest.approx(want["samples"] / total, rel=1e-12)
        assert row["reward_mean"] == want["reward_mean"]
        assert row["response_mean"] == pytest.approx(want["response_mean"], rel=1e-12)
        assert row["generate_p90_s"] == pytest.approx(want["generate_p90_s"], rel=1e-12)
        assert row["last_reward_mean"] == want["last_reward_mean"]
    # the figures themselves, worked by hand: math 6 + 2 + 3 samples, code 2 + 6
    assert rows["math"]["reward_mean"] == (5.0 + 0.25 + 1.5) / 11  # 0.6136, not 0.625
    assert rows["code"]["reward_mean"] == 5.5 / 8  # 0.6875, not (0 + 0.9167) / 2 = 0.458
    assert (rows["math"]["samples"], rows["code"]["samples"]) == (11, 8)
    assert (rows["math"]["last_step"], rows["code"]["last_step"]) == (3, 2)
    assert rows["code"]["last_reward_mean"] == 5.5 / 6
    assert rows["code"]["response_mean"] == (820 + 1815) / 8


def test_a_run_without_data_sources_has_no_section(tmp_path) -> None:
    traces = tmp_path / "traces.jsonl"
    tel = rlotel.init(run="plain", prometheus_port=None, traces_file=traces)
    with tel.step(1), tel.phase("gen"):
        tel.record_samples(generate_sequences=[0.1, 0.2], response_length=[5, 6], reward=[1, 0])
    tel.shutdown()
    page = write_report(traces, tmp_path / "report.html").path
    assert page_data(page)["data_sources"] == []
    assert '<section id="data-sources" hidden>' in page.read_text()


@pytest.mark.slow  # headless Chromium
def test_the_by_source_table_in_headless_chromium(tmp_path) -> None:
    from tests.chromium import Chromium, chromium_binary, file_url

    if chromium_binary() is None:
        pytest.fail("chromium is not installed: `make system-deps` installs Debian's")
    traces = tmp_path / "traces.jsonl"
    write_run(traces, RUN)
    page = write_report(traces, tmp_path / "report.html").path
    with Chromium(height=800) as browser:
        load = browser.open(file_url(page), "document.body.dataset.ready === '1'")
        assert load.console_errors == [] and load.requests == []
        table = json.loads(
            browser.evaluate(
                """JSON.stringify({
                  hidden: document.getElementById('data-sources').hidden,
                  rows: [...document.querySelectorAll('#source-table tr')]
                          .map((tr) => [...tr.children].map((c) => c.textContent)),
                })"""
            )
        )
    assert not table["hidden"]
    head, math, code = table["rows"]
    assert head[:5] == ["data source", "steps", "samples", "share of samples", "mean reward"]
    assert math[:5] == ["math", "3", "11", "57.9%", "0.6136"]
    assert code[:5] == ["code", "2", "8", "42.1%", "0.6875"]
    assert code[5] == "329.4"  # (820 + 1815) / 8 tokens
    assert code[7:] == ["2", "0.9167", "+0.2292"]  # its last step against the run


# --- compare --------------------------------------------------------------------------------

# B: math alone (no code), longer answers and a lower reward.
RUN_B = [
    [("math", 0.5, 300, 0.3), ("math", 0.0, 320, 0.4), ("math", 1.0, 310, 0.3)],
    [("math", 0.5, 330, 0.4), ("math", 0.25, 340, 0.5)],
    [("math", 0.0, 350, 0.5), ("math", 1.0, 360, 0.6), ("math", 0.5, 370, 0.4),
     ("math", 0.75, 380, 0.5), ("math", 0.5, 390, 0.6), ("math", 0.25, 400, 0.7)],
]  # fmt: skip


def test_compare_by_data_source_with_a_source_in_one_run(tmp_path, capsys) -> None:
    base, new = tmp_path / "base.jsonl", tmp_path / "new.jsonl"
    write_run(base, RUN, "base")
    write_run(new, RUN_B, "new")
    page = tmp_path / "compare.html"
    code = cli.main(["compare", str(base), str(new), "--skip", "0", "--json", "--html", str(page)])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    by_source = result["sources"]
    assert list(by_source) == ["math", "code"]
    math = by_source["math"]
    want_base, want_new = expected(RUN, "math"), expected(RUN_B, "math")
    for side, want in (("base", want_base), ("new", want_new)):
        assert math[side]["samples"] == want["samples"] and math[side]["steps"] == 3
        assert math[side]["reward_mean"] == want["reward_mean"]
        assert math[side]["response_mean"] == pytest.approx(want["response_mean"], rel=1e-12)
    assert want_new["reward_mean"] != pytest.approx(want_new["mean_of_means"], abs=0.01)
    assert math["change"]["samples"] == pytest.approx(11 / 11 - 1)
    assert math["change"]["reward_mean"] == pytest.approx(
        want_new["reward_mean"] - want_base["reward_mean"], rel=1e-12
    )
    assert math["change"]["response_mean"] == pytest.approx(
        want_new["response_mean"] / want_base["response_mean"] - 1, rel=1e-12
    )
    assert math["only_in"] is None
    code_row = by_source["code"]
    assert code_row["only_in"] == "base" and code_row["new"] is None
    assert code_row["base"]["samples"] == 8 and code_row["base"]["reward_mean"] == 5.5 / 8
    assert code_row["change"] == {"samples": None, "reward_mean": None, "response_mean": None}

    # the text table, and the page's table
    comparison = compare.compare_runs(compare.load(base), compare.load(new), skip=0)
    text = compare.format_sources(comparison).splitlines()
    assert text[0].startswith("By data source, over 3 / 3 kept steps")
    assert text[2].split() == [
        "math", "11", "11", "+0.0", "%", "0.6136", "0.4773", "-0.1364",
        "210.9", "350.0", "+66", "%",
    ]  # fmt: skip  # 6.75/11, 5.25/11; 2320/11, 3850/11 tokens
    assert text[3].split()[:4] == ["code", "8", "–", "only"]
    assert "only in base" in text[3]
    html = page.read_text()
    cells = re.findall(r'<tr data-source="code">(.*?)</tr>', html)[0]
    assert re.findall(r">([^<]*)</td>", cells)[:4] == ["code", "8", "–", "only in base"]
    assert html.count("<tr data-source=") == 2
    assert cli.main(["compare", str(base), str(new), "--skip", "0"]) == 0  # the console's
    shown = capsys.readouterr().out
    rows = [line.split("│") for line in shown.splitlines() if line.count("│") == 6]
    cells = [[cell.strip() for cell in row[1:-1]] for row in rows]
    assert ["", "mean reward", "0.6136", "0.4773", "-0.1364"] in cells, shown  # math's
    assert ["code", "samples", "8", "–", "only in base"] in cells, shown


def test_compare_without_figures_on_one_side_has_no_by_source_table(tmp_path) -> None:
    base, new = tmp_path / "base.jsonl", tmp_path / "new.jsonl"
    write_run(base, RUN, "base")
    tel = rlotel.init(run="plain", prometheus_port=None, traces_file=new)
    for number in (1, 2, 3):
        with tel.step(number), tel.phase("gen"):
            tel.record_samples(generate_sequences=[0.1, 0.2], reward=[1.0, 0.0])
    tel.shutdown()
    comparison = compare.compare_runs(compare.load(base), compare.load(new), skip=0)
    assert comparison.sources == [] and comparison.as_json()["sources"] == {}
    assert compare.format_sources(comparison) == ""
    assert "By data source" not in compare.render_html(comparison)


def test_analyze_prints_each_source_weighed_by_its_samples(tmp_path, capsys) -> None:
    traces = tmp_path / "traces.jsonl"
    write_run(traces, RUN)
    assert cli.main(["analyze", str(traces)]) == 0
    shown = capsys.readouterr().out
    assert "by data source" in shown, shown
    rows = {
        cells[0]: cells
        for cells in (
            [cell.strip() for cell in line.split("│")[1:-1]]
            for line in shown.splitlines()
            if line.count("│") == 8
        )
    }
    for source in ("math", "code"):
        want = expected(RUN, source)
        steps, samples, _, reward, response, p90 = rows[source][1:]
        assert (int(steps), int(samples)) == (want["steps"], want["samples"])
        assert reward == f"{want['reward_mean']:.4f}" != f"{want['mean_of_means']:.4f}"
        assert response == f"{want['response_mean']:.1f}"
        assert p90 == f"{want['generate_p90_s']:.3f} s"
