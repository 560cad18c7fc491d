"""`rlotel compare`: intervals, verdict, gate and pages on real inputs.

Fast tier: the bootstrap against literal resampling and the exact distribution, verl
FileLogger JSONL written with verl's key names, real rlotel traces files (whole, truncated,
with sample spans), every bad input. Slow tier: real `rlotel demo` runs (A/A and
`--ppo-epochs 1` vs `8`) and the page in headless Chromium.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import rlotel
from rlotel.cli import commands as cli
from rlotel.offline import compare
from rlotel.schema import vocabulary as voc

PHASES = ["gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "update_weights"]
WINDOW_KEYS = {"base", "new", "change", "ci95", "significant"}


# --- inputs -------------------------------------------------------------------------------


def verl_log(
    path: Path, steps: int, update_actor: float, seed: int, gen: np.ndarray | None = None
) -> np.ndarray:
    """verl's FileLogger lines, `{"step": N, "data": {...}}`, with its own key names; returns
    the gen seconds used (pass them to another log for an identical gen window)."""
    rng = np.random.default_rng(seed)
    gen = rng.lognormal(np.log(10.0), 0.05, steps) if gen is None else gen
    with path.open("w") as out:
        for number in range(1, steps + 1):
            timing = {
                "gen": float(gen[number - 1]),
                "reward": 0.5 * rng.lognormal(0, 0.05),
                "old_log_prob": 1.0 * rng.lognormal(0, 0.05),
                "ref": 1.0 * rng.lognormal(0, 0.05),
                "adv": 0.01,
                "update_actor": update_actor * rng.lognormal(0, 0.02),
                "update_weights": 0.3 * rng.lognormal(0, 0.05),
            }
            step = sum(timing.values()) + 0.2  # time between windows: unaccounted
            tokens = 4096 * 64
            data = {
                **{f"{voc.TIMING_S}{name}": seconds for name, seconds in timing.items()},
                f"{voc.TIMING_S}{voc.STEP}": step,
                f"{voc.TIMING_PER_TOKEN_MS}gen": timing["gen"] * 1000 / tokens,
                voc.TIME_PER_STEP: step,
                voc.TOTAL_NUM_TOKENS: tokens,
                voc.THROUGHPUT: tokens / step / 8,
                f"{voc.MFU}actor": 0.3 * 5.0 / timing["update_actor"],
                f"{voc.AGENT_LOOP}{voc.GENERATE_SEQUENCES}/mean": timing["gen"] / 4,
                f"{voc.AGENT_LOOP}{voc.GENERATE_SEQUENCES}/max": timing["gen"] * 0.9,
                "actor/pg_loss": float(rng.normal()),
                "critic/score/mean": float(rng.random()),
                "response_length/mean": 400.0,
            }
            out.write(json.dumps({"step": number, "data": data}) + "\n")
    return gen


def traced_run(path: Path, steps: int, samples: int = 6, max_sample_spans: int = 4) -> None:
    """A real rlotel traces file: phases around real work, per-sample timings, tokens, MFU;
    one export batch per step, so a truncated line costs one step."""
    rng = np.random.default_rng(7)
    tel = rlotel.init(
        run="cmp", prometheus_port=None, traces_file=path, max_sample_spans=max_sample_spans
    )
    for number in range(1, steps + 1):
        with tel.step(number) as step:
            for phase in PHASES:
                with tel.phase(phase):
                    sum(range(20_000))
                    if phase == "gen":
                        tel.record_samples(
                            generate_sequences=rng.lognormal(-3, 0.5, samples).tolist(),
                            response_length=rng.integers(10, 90, samples).tolist(),
                        )
            step.set_tokens(prompt=[4] * samples, response=[40] * samples)
            step.set_mfu(actor=0.2)
        tel.flush()
    tel.shutdown()


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main(["compare", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def logs(tmp_path) -> dict[str, Path]:
    """base; `slower`: update_actor ×1.5 (still rollout-bound); `moved`: ×3 (update-bound);
    gen identical in all three, so it cannot differ."""
    paths = {name: tmp_path / f"{name}.jsonl" for name in ("base", "slower", "moved")}
    gen = verl_log(paths["base"], 40, update_actor=5.0, seed=1)
    verl_log(paths["slower"], 40, update_actor=7.5, seed=2, gen=gen)
    verl_log(paths["moved"], 40, update_actor=15.0, seed=3, gen=gen)
    return paths


# --- the bootstrap ------------------------------------------------------------------------


@pytest.mark.parametrize("n", [7, 8])
def test_bootstrap_medians_match_literal_resampling(n) -> None:
    values = np.arange(1, n + 1, dtype=float) ** 2  # every pair average distinct
    resamples = 60_000
    drawn = compare.bootstrap_medians(values, np.random.default_rng(1), resamples)
    rng = np.random.default_rng(2)
    literal = np.median(values[rng.integers(0, n, (resamples, n))], axis=1)
    support = np.union1d(drawn, literal)
    ours = np.array([(drawn == v).mean() for v in support])
    theirs = np.array([(literal == v).mean() for v in support])
    assert 0.5 * np.abs(ours - theirs).sum() < 0.02  # total variation: sampling noise only
    assert set(np.unique(drawn)) <= set(np.unique(literal)) | set(support)
    assert np.percentile(drawn, [2.5, 50, 97.5]).tolist() == pytest.approx(
        np.percentile(literal, [2.5, 50, 97.5]).tolist(), rel=0.1
    )


def test_bootstrap_median_of_odd_n_has_the_exact_order_statistic_law() -> None:
    """P(resample median <= x_(j)) = P(Binomial(n, j/n) >= k) for odd n = 2k - 1."""
    n, k = 5, 3
    values = np.array([3.0, 1.0, 4.0, 1.5, 9.0])
    ordered = np.sort(values)
    drawn = compare.bootstrap_medians(values, np.random.default_rng(3), 200_000)
    for j in range(1, n + 1):
        p = j / n
        exact = sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1))
        assert (drawn <= ordered[j - 1]).mean() == pytest.approx(exact, abs=0.005)


def test_relative_change_interval_covers_a_known_shift() -> None:
    rng = np.random.default_rng(4)
    base = rng.lognormal(0, 0.1, 500)
    new = 1.2 * rng.lognormal(0, 0.1, 500)
    change, ci = compare.relative_change(base, new, np.random.default_rng(5))
    assert ci[0] < 0.2 < ci[1] and ci[0] < change < ci[1]
    assert ci[1] - ci[0] < 0.05
    same, same_ci = compare.relative_change(base, base.copy(), np.random.default_rng(5))
    assert same == 0 and same_ci[0] < 0 < same_ci[1]
    assert compare.relative_change(np.zeros(5), new[:5], rng) == (None, None)  # base 0
    assert compare.relative_change(base[:1], new[:1], rng)[1] is None  # one step: no interval


# --- verl FileLogger JSONL ----------------------------------------------------------------


def test_verl_logs_name_the_slower_window(logs, capsys) -> None:
    code, out, err = run_cli(capsys, str(logs["base"]), str(logs["slower"]), "--json")
    assert code == 0 and err == ""
    result = json.loads(out)
    windows = result["windows"]
    assert set(result) >= {"windows", "verdict"}
    assert all(set(w) == WINDOW_KEYS for w in windows.values())
    assert [*windows][: len(PHASES) + 2] == [*PHASES, "step", "unaccounted"]
    assert {"throughput", "mfu/actor", "gen_sample/mean", "gen_sample/max"} <= set(windows)
    actor = windows["update_actor"]
    assert actor["significant"] and 0.45 < actor["change"] < 0.55
    assert actor["ci95"][0] < 0.5 < actor["ci95"][1]
    assert actor["base"] == pytest.approx(5.0, rel=0.03)
    assert not windows["gen"]["significant"] and windows["gen"]["change"] == 0
    assert windows["throughput"]["significant"] and windows["throughput"]["change"] < 0
    assert windows["mfu/actor"]["change"] < 0  # the same work in more seconds
    assert result["verdict"].startswith("update_actor +50 % [")
    assert "step +" in result["verdict"]
    assert result["verdict"].endswith("the bottleneck stayed rollout-bound")
    assert result["bottleneck"] == {"base": "rollout-bound", "new": "rollout-bound", "moved": False}
    assert result["runs"]["base"]["steps"] == 40 and result["runs"]["base"]["kept"] == 36


def test_verl_logs_bottleneck_moved(logs, capsys) -> None:
    code, out, _ = run_cli(capsys, str(logs["base"]), str(logs["moved"]))
    assert code == 0
    verdict = out.strip().splitlines()[-1]
    match = re.fullmatch(
        r"update_actor \+(\d+) % \[(\d+) %, (\d+) %\]; step \+\d+ % \[\d+ %, \d+ %\]; "
        r"the bottleneck moved from rollout-bound to update-bound",
        verdict,
    )
    assert match, verdict
    change, low, high = map(int, match.groups())
    assert 195 <= change <= 205 and low <= change <= high  # x3: +200 % and 2 % noise
    assert "update_actor" in out and "throughput" in out  # the table


def test_output_is_deterministic(logs, capsys) -> None:
    first = run_cli(capsys, str(logs["base"]), str(logs["slower"]), "--json")
    second = run_cli(capsys, str(logs["base"]), str(logs["slower"]), "--json")
    assert first == second
    other_seed = compare.compare_runs(
        compare.load(logs["base"]), compare.load(logs["slower"]), seed=1
    )
    assert (
        other_seed.windows["update_actor"].ci95
        != (json.loads(first[1])["windows"]["update_actor"]["ci95"])
    )


def test_skip(logs, capsys) -> None:
    assert compare.default_skip(40) == 4 and compare.default_skip(5) == 1
    assert compare.default_skip(1) == 0  # a one-step run keeps its step
    code, out, _ = run_cli(capsys, str(logs["base"]), str(logs["slower"]), "--skip", "30", "--json")
    assert code == 0 and json.loads(out)["runs"]["new"]["kept"] == 10
    code, out, err = run_cli(capsys, str(logs["base"]), str(logs["slower"]), "--skip", "40")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "--skip 40 leaves no step" in err


def test_a_window_under_1_percent_of_the_step_is_never_significant(logs, tmp_path, capsys):
    doubled = tmp_path / "adv.jsonl"
    with doubled.open("w") as out:
        for line in logs["base"].read_text().splitlines():
            record = json.loads(line)
            record["data"][f"{voc.TIMING_S}adv"] += 0.01  # 0.01 s of an ~18 s step: x2
            record["data"][f"{voc.TIMING_S}{voc.STEP}"] += 0.01
            out.write(json.dumps(record) + "\n")
    code, out, _ = run_cli(
        capsys, str(logs["base"]), str(doubled), "--fail-if", "adv>+10%", "--json"
    )
    result = json.loads(out)
    adv = result["windows"]["adv"]
    assert code == 0
    assert adv["change"] == pytest.approx(1.0) and adv["ci95"][0] > 0.5  # excludes 0...
    assert not adv["significant"] and result["negligible"] == ["adv"]  # ...but is tiny
    assert result["verdict"].startswith("no significant change")
    code, out, _ = run_cli(capsys, str(logs["base"]), str(doubled))
    assert re.search(r"│ adv .*│ +<1% │", out), out


# --- the gate -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gates", "code"),
    [
        (["update_actor>+10%"], 1),
        (["update_actor>+60%"], 0),  # +50 %: significant, not past +60 %
        (["step>+5%"], 1),
        (["gen>+1%"], 0),  # identical gen: not significant
        (["throughput<-5%"], 1),
        (["throughput < -50 %"], 0),
        (["update_actor<-10%"], 0),  # it rose
        (["gen>+1%", "update_actor>+10%"], 1),
    ],
)
def test_gate(logs, capsys, gates, code) -> None:
    args = [str(logs["base"]), str(logs["slower"])]
    result, out, err = run_cli(capsys, *args, *(f"--fail-if={g}" for g in gates), "--json")
    assert result == code
    failed = [g["expression"] for g in json.loads(out)["gates"] if g["failed"]]
    assert len(failed) == code
    assert len(err.strip().splitlines()) == code  # one line per failed gate
    for expression in failed:
        assert f"--fail-if {expression} failed: " in err


def test_gate_on_the_same_log_passes(logs, capsys) -> None:
    code, out, _ = run_cli(
        capsys, str(logs["base"]), str(logs["base"]), "--fail-if", "step>+5%", "--json"
    )
    result = json.loads(out)
    assert code == 0 and not any(w["significant"] for w in result["windows"].values())
    assert result["verdict"].startswith("no significant change in ")


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("step>5", "expected WINDOW>+N% or WINDOW<-N%"),
        ("step=+5%", "expected WINDOW>+N% or WINDOW<-N%"),
        ("step>+five%", "expected WINDOW>+N% or WINDOW<-N%"),
        (">+5%", "expected WINDOW>+N% or WINDOW<-N%"),
        ("step>>+5%", "expected WINDOW>+N% or WINDOW<-N%"),
        ("", "expected WINDOW>+N% or WINDOW<-N%"),
        ("update_critic>+5%", "no window 'update_critic' in either run (windows: gen, "),
    ],
)
def test_bad_expression_exits_2_with_one_line(logs, capsys, expression, message) -> None:
    code, out, err = run_cli(
        capsys, str(logs["base"]), str(logs["slower"]), "--fail-if", expression
    )
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("rlotel: --fail-if ") and message in err


def test_unreadable_inputs_exit_2_with_one_line(logs, tmp_path, capsys) -> None:
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_bytes(b'\x00\xff not json\n{"neither": 1}\n')
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    cases = [
        (tmp_path / "missing.jsonl", "does not exist"),
        (garbage, "no steps found in"),
        (empty_dir, "no steps found in"),
    ]
    for bad, message in cases:
        for args in ([str(bad), str(logs["base"])], [str(logs["base"]), str(bad)]):
            code, out, err = run_cli(capsys, *args)
            assert code == 2 and out == "", (bad, err)
            assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
            assert message in err and str(bad) in err


# --- rlotel traces ------------------------------------------------------------------------


def test_truncated_traces_file_is_compared_from_what_is_valid(tmp_path, capsys) -> None:
    whole = tmp_path / "whole.jsonl"
    traced_run(whole, steps=8)
    cut = tmp_path / "cut.jsonl"
    lines = whole.read_text().splitlines(keepends=True)
    cut.write_text("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2] + "\n{oops\n")
    assert len(compare.load(whole).steps) == 8
    code, out, err = run_cli(capsys, str(whole), str(cut), "--json", "--html", str(tmp_path / "p"))
    assert code == 0
    result = json.loads(out)
    assert result["runs"]["new"] == {
        "source": str(cut),
        "steps": 7,
        "kept": 7 - compare.default_skip(7),
        "skipped_lines": 2,
    }
    assert result["runs"]["base"]["skipped_lines"] == 0
    assert err.splitlines() == [
        f"rlotel: 2 unreadable line(s) in {cut} skipped",
        "html: " + str(tmp_path / "p"),
    ]
    assert set(PHASES) | {"step", "unaccounted", "mfu/actor", "throughput"} <= set(
        result["windows"]
    )
    page = (tmp_path / "p").read_text()
    assert f"2 unreadable line(s) skipped in {cut}" in page


def test_gen_sample_quantiles_where_sample_spans_cover_every_sample(tmp_path) -> None:
    few, every = tmp_path / "few.jsonl", tmp_path / "every.jsonl"
    traced_run(few, steps=4, samples=6, max_sample_spans=4)
    traced_run(every, steps=4, samples=6, max_sample_spans=6)
    assert (
        "gen_sample/p50" not in compare.compare_runs(compare.load(few), compare.load(few)).windows
    )  # the slowest 4 of 6: no median of the step
    run = compare.load(every)
    result = compare.compare_runs(run, run, skip=0)
    seconds = compare.sample_seconds(run.spans)
    per_step = [seconds[s.span.trace_id] for s in run.steps]
    assert all(len(values) == 6 for values in per_step)
    assert result.windows["gen_sample/p50"].base == pytest.approx(
        float(np.median([np.quantile(v, 0.5) for v in per_step]))
    )
    assert result.windows["gen_sample/p99"].base == pytest.approx(
        float(np.median([np.quantile(v, 0.99) for v in per_step]))
    )


# --- the page -----------------------------------------------------------------------------


def test_html_is_self_contained_and_escaped(logs, tmp_path, capsys) -> None:
    odd = tmp_path / "odd.jsonl"
    lines = logs["slower"].read_text().splitlines()
    with odd.open("w") as out:
        for line in lines:
            record = json.loads(line)
            record["data"][f"{voc.TIMING_S}<em>x&"] = 0.5  # a phase name with markup
            out.write(json.dumps(record) + "\n")
    page = tmp_path / "compare.html"
    code, out, _ = run_cli(capsys, str(logs["base"]), str(odd), "--html", str(page))
    assert code == 0 and f"html: {page}" in out
    text = page.read_text()
    assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)=", text)
    assert "http://" not in text and "https://" not in text
    assert "<em>x&" not in text and 'data-window="&lt;em&gt;x&amp;"' in text
    blob = re.search(
        r'<script type="application/json" id="rlotel-compare">(.*?)</script>', text, re.S
    )
    data = json.loads(blob.group(1))
    assert "<em>x&" in data["windows"]  # intact in the data, inert in the markup
    assert data["windows"]["<em>x&"]["change"] is None  # base never ran it: no ratio
    assert text.count('<tr class="') == len(data["windows"])


# --- real demo runs -----------------------------------------------------------------------


def demo(runs: Path, run: str, *knobs: str) -> subprocess.Popen:
    command = [
        sys.executable, "-m", "rlotel.cli", "demo", "--seed", "0", "--port", "0",
        "--runs-dir", str(runs), "--run", run, *knobs,
    ]  # fmt: skip
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    os.sched_setaffinity(process.pid, {min(os.sched_getaffinity(0))})  # before its first step
    return process


@pytest.fixture(scope="module")
def demo_runs(tmp_path_factory) -> Path:
    """Pairs of demo runs at the same time on one core: the scheduler shares it between the
    two, so whatever else loads the machine slows both alike (run one after the other, a
    load that starts in between is a real difference between them). `a` and `b` are
    identical; `epochs8` has an eight times heavier update, beside a twin that gives it
    the share of the core `a` had. Alike is not equal in the millisecond windows (the
    unaccounted time between phases is the scheduler's: beside a real run, A/A differed
    there 1.8 → 5.7 ms), so its tests are `timing`: they run after the real runs."""
    runs = tmp_path_factory.mktemp("runs")
    light, heavy = ("--steps", "16"), ("--steps", "6", "--ppo-epochs", "8")
    for pair in ([("a", *light), ("b", *light)], [("epochs8", *heavy), ("twin", *heavy)]):
        processes = [demo(runs, *knobs) for knobs in pair]
        for process in processes:
            _, stderr = process.communicate(timeout=300)
            assert process.returncode == 0, stderr[-3000:]
    return runs


GATES = ["--fail-if", "step>+5%", "--fail-if", "update_actor>+10%", "--fail-if", "throughput<-5%"]


@pytest.mark.slow
@pytest.mark.timing  # demo_runs: runs judged against each other, on a quiet machine
def test_demo_a_a_passes_the_gates_and_the_step_holds(demo_runs, capsys) -> None:
    """Two identical runs: no gate fails, and neither the step, `gen` nor throughput
    changed. The ~30 ms windows (old_log_prob, ref, the MFU read from them) are not
    asserted: between two processes they differ by 20–40 % (a per-process difference the
    steps of one run cannot show), significant in 2 of 15 pairs measured here (2026-12-03,
    a quiet 2-core machine); the step, `gen` and throughput in none, |step| ≤ 6.3 %,
    update_actor's largest significant change +8.3 % (gate +10 %)."""
    code, out, err = run_cli(capsys, str(demo_runs / "a"), str(demo_runs / "b"), *GATES, "--json")
    result = json.loads(out)
    assert code == 0 and err == "", err
    held = {name: result["windows"][name] for name in ("step", "gen", "throughput")}
    assert not any(window["significant"] for window in held.values()), held
    assert result["verdict"].endswith("the bottleneck stayed rollout-bound")


@pytest.mark.slow
@pytest.mark.timing  # demo_runs: runs judged against each other, on a quiet machine
def test_demo_heavier_update_fails_the_gate(demo_runs, capsys) -> None:
    gates = ["--fail-if", "update_actor>+10%", "--fail-if", "gen>+1000%"]
    code, out, err = run_cli(
        capsys, str(demo_runs / "a"), str(demo_runs / "epochs8"), *gates, "--json"
    )
    result = json.loads(out)
    actor = result["windows"]["update_actor"]
    assert code == 1
    assert actor["significant"] and actor["ci95"][0] > 1.0  # more than twice as slow, surely
    assert result["bottleneck"] == {"base": "rollout-bound", "new": "update-bound", "moved": True}
    assert re.match(r"update_actor \+\d+ % \[\d+ %, \d+ %\]; ", result["verdict"])
    assert result["verdict"].endswith("; the bottleneck moved from rollout-bound to update-bound")
    assert [g["failed"] for g in result["gates"]] == [True, False]
    assert err.startswith("rlotel: --fail-if update_actor>+10% failed: update_actor +")
    assert len(err.splitlines()) == 1


@pytest.mark.slow
@pytest.mark.timing  # demo_runs: runs judged against each other, on a quiet machine
def test_demo_comparison_page_in_headless_chromium(demo_runs, tmp_path, capsys) -> None:
    from tests.chromium import Chromium, chromium_binary, file_url

    if chromium_binary() is None:
        pytest.fail("chromium is not installed: `make system-deps` installs Debian's")
    page = tmp_path / "compare.html"
    code, out, _ = run_cli(
        capsys,
        str(demo_runs / "a"),
        str(demo_runs / "epochs8"),
        "--fail-if",
        "update_actor>+10%",
        "--json",
        "--html",
        str(page),
    )
    assert code == 1
    result = json.loads(out)
    with Chromium(height=1400) as browser:
        load = browser.open(file_url(page), "document.body.dataset.ready === '1'")
        dom = json.loads(
            browser.evaluate(
                """JSON.stringify({
                  windows: document.body.dataset.windows,
                  rows: [...document.querySelectorAll('#windows tbody tr')]
                          .map(r => r.dataset.window),
                  significant: [...document.querySelectorAll('#windows tr.significant')]
                          .map(r => r.dataset.window),
                  failed: [...document.querySelectorAll('#windows tr.failed')]
                          .map(r => r.dataset.window),
                  verdict: document.getElementById('verdict').textContent,
                  intervals: document.querySelectorAll('#windows svg line.ci').length,
                  width: document.querySelector('#windows svg').getBoundingClientRect().width,
                })"""
            )
        )
    assert load.console_errors == []
    assert load.requests == []
    assert dom["rows"] == list(result["windows"]) and dom["windows"] == str(len(dom["rows"]))
    assert dom["significant"] == [n for n, w in result["windows"].items() if w["significant"]]
    assert dom["failed"] == ["update_actor"]
    assert dom["verdict"] == result["verdict"]
    assert dom["intervals"] == sum(w["ci95"] is not None for w in result["windows"].values())
    assert dom["width"] > 100  # the interval plots were laid out


def test_help_names_the_command_and_its_options(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--help"])
    assert exit_info.value.code == 0
    assert "compare" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["compare", "--help"])
    text = capsys.readouterr().out
    assert exit_info.value.code == 0
    for option in ("--skip", "--json", "--html", "--fail-if", "--resamples", "step>+5%"):
        assert option in text
