"""The `rlotel` command line (also `python -m rlotel`): `rlotel --help` lists every command,
from the parser below, and `rlotel COMMAND --help` its options with their defaults. A command
whose optional dependency is not installed says in one line what to install, exit 2."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

import rlotel
from rlotel.demo.interrupt import EXIT_INTERRUPTED, POINTS, CtrlC, Interrupted
from rlotel.derive import goodput
from rlotel.derive.diagnose import Diagnoser, Verdict
from rlotel.schema import data_moves as dm
from rlotel.schema import vocabulary as voc

if TYPE_CHECKING:
    from rlotel.demo.loop import DemoResult

console = Console()
errors = Console(stderr=True, soft_wrap=True)


# What to install for an optional dependency a command imports: the extra, by top-level module.
# torch's own index has its CPU build; PyPI's torch is a CUDA build of several GB on Linux.
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
INSTALL = {
    "torch": f"pip install 'rlotel[demo]' --extra-index-url {CPU_TORCH_INDEX}",
    "ray": "pip install 'rlotel[ray]'",
    "nvtx": "pip install 'rlotel[nvtx]'",
    "verl": "pip install 'rlotel[verl]'",
}


def _missing(command: str, modules: tuple[str, ...]) -> int:
    """2 after one line naming what to install when a module `command` needs is not
    installed, else 0."""
    for module in modules:
        if importlib.util.find_spec(module) is None:
            _say_install(command, module)
            return 2
    return 0


def _say_install(command: str, module: str) -> None:
    errors.print(
        f"{command}: needs {module}, not installed here: {INSTALL[module]}",
        style="red",
        markup=False,
        highlight=False,
    )


def _demo(args: argparse.Namespace) -> int:
    """Exit 0 once every file is written (Ctrl-C while serving included), 1 when the report
    failed, 2 on a bad option or a missing dependency (one line: what to install), 130 when
    Ctrl-C cut the run short (`rlotel.demo.interrupt`): then telemetry still shuts down whole
    and the last lines say what was written."""
    needed = ("torch", "ray") if args.ray else ("torch",)
    if _missing("rlotel demo" + (" --ray" if args.ray else ""), needed):
        return 2  # before /metrics is up and its URL printed
    run_dir = Path(args.runs_dir) / args.run
    files = _DemoFiles(run_dir)
    with CtrlC(console.print, args.hold_at) as ctrl_c:
        tel: rlotel.Telemetry | None = None
        point = "starting"
        try:
            tel = _demo_start(args, files)
            if tel is None:
                return 2
            ctrl_c.checkpoint(point)
            point = "training"
            outcome = _demo_train(args, tel, ctrl_c, files)
            point = "printing"
            return _demo_finish(args, tel, ctrl_c, files, outcome)
        except Interrupted as stop:
            point = stop.point
        except Exception:
            if not ctrl_c.requested:  # a crash, not something Ctrl-C broke (Ray's workers)
                raise
        finally:
            if tel is not None:
                tel.shutdown()  # the finished steps' spans into traces.jsonl
        files.say_interrupted(point, args.steps)
        return EXIT_INTERRUPTED


class _DemoFiles:
    """The files the demo promises and which of them it has written; a new run first
    removes the ones an earlier run of the same name left."""

    def __init__(self, run_dir: Path) -> None:
        self.traces = run_dir / "traces.jsonl"
        self.summary = run_dir / "summary.json"
        self.report = run_dir / "report.html"
        self.steps_done = 0
        self.written: set[Path] = set()

    def clear(self) -> None:
        for old in [*self.traces.parent.glob("traces*.jsonl"), self.summary, self.report]:
            old.unlink(missing_ok=True)

    def say_interrupted(self, point: str, steps: int) -> None:
        if self.traces.exists():  # telemetry writes it from its start, step by step
            self.written.add(self.traces)
        promised = (self.traces, self.summary, self.report)
        made = [str(path) for path in promised if path in self.written]
        missing = [str(path) for path in promised if path not in self.written]
        console.print(
            f"interrupted (Ctrl-C) at {point}, after {self.steps_done} of {steps} steps"
            f"\nwritten: {', '.join(made) or 'nothing'}\nnot written: {', '.join(missing)}",
            markup=False,
            soft_wrap=True,
        )


def _demo_start(args: argparse.Namespace, files: _DemoFiles) -> rlotel.Telemetry | None:
    """Telemetry for a new run (its old files removed), or None after saying why not."""
    files.clear()
    # an address or port not given: OTEL_EXPORTER_PROMETHEUS_HOST / _PORT, as rlotel.init reads
    where = {"prometheus_addr": args.addr, "prometheus_port": args.port}
    try:
        tel = rlotel.init(
            run=args.run,
            **{option: value for option, value in where.items() if value is not None},
            traces_file=files.traces,
            profile_steps=args.profile_steps,
            profile_dir=files.traces.parent / "profile" if args.profile_steps else None,
            max_sample_spans=args.sample_spans,
        )
    except rlotel.ConfigError as error:
        errors.print(f"[red]rlotel: {error}[/red]")
        return None
    after = (
        "until Ctrl-C after training"
        if args.serve
        else f"{args.serve_seconds:g}s after training"
        if args.serve_seconds > 0
        else "while training; --serve-seconds N or --serve keeps it up after"
    )
    console.print(
        f"rlotel demo: run [bold]{args.run}[/bold], metrics at {tel.metrics_url} ({after})",
        soft_wrap=True,  # one line, the URL whole
    )
    return tel


def _demo_train(
    args: argparse.Namespace, tel: rlotel.Telemetry, ctrl_c: CtrlC, files: _DemoFiles
) -> DemoResult:
    """The training loop under a progress bar; Ctrl-C stops it at the next step boundary."""
    from rlotel.demo.loop import DemoConfig, StepResult, train

    config = DemoConfig(
        steps=args.steps, seed=args.seed, peak_flops=args.peak_flops, ppo_epochs=args.ppo_epochs
    )
    with Progress(
        TextColumn("[bold]step"),
        MofNCompleteColumn(),
        BarColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        task = progress.add_task("train", total=config.steps, status="")

        def on_step(result: StepResult) -> None:
            files.steps_done += 1
            phases = {k: v for k, v in result.timing_raw.items() if k != "step"}
            largest = max(phases, key=phases.get)
            progress.update(
                task,
                advance=1,
                status=f"{result.timing_raw['step'] * 1000:6.1f} ms/step, largest "
                f"{largest} {phases[largest] * 1000:.1f} ms, reward {result.reward_mean:.3f}",
            )
            ctrl_c.checkpoint("training")

        if args.async_mode:
            from rlotel.demo.async_loop import AsyncConfig, train_async

            limit = "" if args.max_staleness is None else f", max staleness {args.max_staleness}"
            progress.console.print(
                "async: a rollout thread fills a 2-batch buffer "
                f"(rollout ×{args.rollout_slowdown}, ppo epochs {args.ppo_epochs}{limit})"
            )
            settings = AsyncConfig(
                config, rollout_slowdown=args.rollout_slowdown, max_staleness=args.max_staleness
            )
            return train_async(tel, settings, on_step)
        remote = None
        if args.ray:
            from rlotel.demo.ray_rollout import RayRollout

            progress.console.print("starting a local Ray cluster (2 CPUs) for generation")
            remote = RayRollout(args.run, files.traces.parent, args.seed)
        try:
            return train(tel, config, on_step, remote)
        finally:
            if remote is not None:
                remote.shutdown()


def _demo_finish(
    args: argparse.Namespace,
    tel: rlotel.Telemetry,
    ctrl_c: CtrlC,
    files: _DemoFiles,
    outcome: DemoResult,
) -> int:
    """summary.json, the tables, report.html, then /metrics served for --serve-seconds;
    Ctrl-C between any two of them stops the demo, and ends serving normally."""
    first, last = outcome.reward_gain()
    files.summary.write_text(
        json.dumps(
            {
                "run": args.run,
                "reward_first": first,
                "reward_last": last,
                "steps": [s.as_json() for s in outcome.steps],
            },
            indent=1,
        )
    )
    files.written.add(files.summary)
    last_step = outcome.steps[-1]
    for printed in (
        _ledger_table(outcome.steps),
        _goodput_table(outcome.steps),
        _verdict_summary(outcome.verdicts),
        f"reward: first steps {first:.3f} → last steps {last:.3f}; tool calls in "
        f"{last_step.tool_call_ratio:.0%} of the last step's samples; slowest sample "
        f"{last_step.metrics.get(voc.AGENT_LOOP_SLOWEST + voc.GENERATE_SEQUENCES, 0) * 1000:.1f}"
        " ms",
        f"traces: {files.traces}\nsummary: {files.summary}",
    ):
        console.print(printed)
        ctrl_c.checkpoint("printing")
    captures = sorted({str(c.path) for step in outcome.steps for c in step.captures})
    if captures:
        console.print("profiler captures:\n  " + "\n  ".join(captures))
    ctrl_c.checkpoint("report")
    tel.flush()  # every span in the traces file before the report reads it
    reported = _demo_report(files.traces.parent)
    if reported == 0:
        files.written.add(files.report)
    if (args.serve or args.serve_seconds > 0) and tel.metrics_url:
        how_long = (
            "until Ctrl-C" if args.serve else f"for {args.serve_seconds:.0f}s (Ctrl-C to stop)"
        )
        console.print(f"metrics: {tel.metrics_url} — serving {how_long}")
        if ctrl_c.wait(None if args.serve else args.serve_seconds):
            console.print("stopped serving (Ctrl-C)")
    return reported


def _demo_report(run_dir: Path) -> int:
    """The run's report.html, printed by path; a failure is one line, the demo still ran."""
    from rlotel.offline.report import ReportError, write_report

    try:
        result = write_report(run_dir, run_dir / "report.html")
    except (ReportError, OSError) as error:
        errors.print(f"[red]rlotel: no report: {error}[/red]")
        return 1
    console.print(f"report: {result.path}")
    return 0


def _report(args: argparse.Namespace) -> int:
    from rlotel.offline.report import ReportError, write_report

    source = Path(args.path)
    out = Path(args.out) if args.out else _default_output(source, "report.html")
    try:
        result = write_report(source, out)
    except ReportError as error:
        errors.print(f"[red]rlotel: {error}[/red]")
        return 1
    except OSError as error:
        errors.print(f"[red]rlotel: cannot read {source} or write {out}: {error}[/red]")
        return 2
    skipped = f", {result.skipped_lines} unreadable line(s) skipped" if result.skipped_lines else ""
    console.print(
        f"report: {result.path} ({result.steps} steps, {result.size_bytes / 1e6:.1f} MB{skipped})"
    )
    return 0


def _perfetto(args: argparse.Namespace) -> int:
    from rlotel.offline.perfetto import PerfettoError, write_perfetto

    source = Path(args.path)
    out = Path(args.out) if args.out else _default_output(source, "trace.json.gz")
    try:
        result = write_perfetto(source, out)
    except PerfettoError as error:
        errors.print(f"[red]rlotel: {error}[/red]")
        return 1
    except OSError as error:
        errors.print(f"[red]rlotel: cannot read {source} or write {out}: {error}[/red]")
        return 2
    notes = [f"{result.events} events from {result.spans} spans"]
    notes.append(f"{result.captures_merged} profiler capture(s) merged")
    if result.captures_missing:
        notes.append(f"{result.captures_missing} capture file(s) not found")
    if result.skipped_lines:
        notes.append(f"{result.skipped_lines} unreadable line(s) skipped")
    console.print(f"timeline: {result.path} ({', '.join(notes)}); open it in ui.perfetto.dev")
    return 0


def _default_output(source: Path, name: str) -> Path:
    """Beside the input: inside a run directory, or next to a file."""
    return source / name if source.is_dir() else source.with_name(name)


def _analyze(args: argparse.Namespace) -> int:
    from rlotel.offline.analyze import load_run, thresholds

    path = Path(args.path)
    if not path.exists():
        errors.print(f"[red]rlotel: {path} does not exist[/red]")
        return 2
    try:
        run = load_run(path)
    except OSError as error:
        errors.print(f"[red]rlotel: cannot read {path}: {error}[/red]")
        return 2
    steps = run.steps
    if not steps and run.skipped_lines:
        errors.print(
            f"[red]rlotel: no readable lines in {path} ({run.skipped_lines} skipped)[/red]"
        )
        return 2
    if not steps:
        errors.print(f"[red]rlotel: no steps found in {path}[/red]")
        return 1
    if run.skipped_lines:
        errors.print(f"rlotel: {run.skipped_lines} unreadable line(s) in {path} skipped")
    every = args.every or len(steps)
    diagnoser = Diagnoser(thresholds(run))  # the run's own, as live
    verdicts = [diagnoser.observe(step.facts) for step in steps]
    for start in range(0, len(steps), every):
        chunk = steps[start : start + every]
        title = f"steps {chunk[0].number}–{chunk[-1].number}"
        console.print(_ledger_table(chunk, title))
        table = _by_source_table(chunk, title)
        if table is not None:
            console.print(table)
        console.print(_verdict_summary(verdicts[start : start + every]))
    return 0


def _by_source_table(steps, title: str) -> Table | None:
    """The steps' trained samples by data source (None where no step has them): samples and
    their share, mean reward and response tokens weighed by samples, median generate p90."""
    from rlotel.offline import sources

    totals = sources.by_source(steps)
    if not totals:
        return None
    everything = sources.total_samples(totals)
    table = Table(title=f"{title} by data source (means weigh each step by its samples)")
    columns = (
        "data source",
        "steps",
        "samples",
        "share",
        "mean reward",
        "mean response",
        "gen p90",
    )
    for column in columns:
        table.add_column(column, justify="left" if column == "data source" else "right")
    for total in totals.values():
        reward, response, p90 = total.reward_mean, total.response_mean, total.generate_p90_s
        table.add_row(
            total.name,
            str(total.steps),
            str(total.samples),
            f"{total.samples / everything:.1%}",
            "–" if reward is None else f"{reward:.4f}",
            "–" if response is None else f"{response:.1f}",
            "–" if p90 is None else f"{p90:.3f} s",
        )
    return table


def _replay(args: argparse.Namespace) -> int:
    from rlotel.offline.replay import replay

    source = Path(args.path)
    if not source.is_file():
        errors.print(f"[red]rlotel: {source} is not a file[/red]")
        return 2
    out = Path(args.out) if args.out else source.with_suffix("")
    run = args.run or source.stem
    try:
        result = replay(source, out, run, step_seconds=args.step_seconds)
    except (OSError, ValueError) as error:
        errors.print(f"[red]rlotel: cannot replay {source}: {error}[/red]")
        return 2
    dropped = ", ".join(f"{reason} ×{n}" for reason, n in sorted(result.dropped.items()))
    console.print(
        f"replayed {result.steps} steps of run {run!r}: {result.samples} samples in "
        f"{result.series} series{f' (skipped: {dropped})' if dropped else ''}\n"
        f"metrics: {result.metrics_path}\n"
        f"  backfill: promtool tsdb create-blocks-from openmetrics {result.metrics_path} "
        "<prometheus data dir>\n"
        f"traces:  {result.traces_path} (reconstructed span trees, rl.reconstructed=true)"
    )
    return 0


def _compare(args: argparse.Namespace) -> int:
    """0: no gate crossed; 1: a significant change crossed a `--fail-if`; 2: bad input."""
    from rlotel.offline import compare

    try:
        gates = [compare.parse_gate(expression) for expression in args.fail_if]
        runs = [compare.load(Path(path)) for path in (args.base, args.new)]
        result = compare.compare_runs(*runs, skip=args.skip, resamples=args.resamples)
        result = compare.check_gates(result, gates)
    except compare.CompareError as error:
        errors.print(f"rlotel: {error}", style="red", markup=False)
        return 2
    for side in (result.base, result.new):
        if side.skipped_lines:
            errors.print(
                f"rlotel: {side.skipped_lines} unreadable line(s) in {side.source} skipped",
                markup=False,
            )
    if args.json:
        sys.stdout.write(json.dumps(result.as_json(), indent=1, allow_nan=False) + "\n")
    else:
        console.print(_compare_table(result))
        if result.sources:
            console.print(_sources_table(result))
        console.print(result.verdict, markup=False, soft_wrap=True)
    if args.html:
        try:
            Path(args.html).write_text(compare.render_html(result), encoding="utf-8")
        except OSError as error:
            errors.print(f"rlotel: cannot write {args.html}: {error}", style="red", markup=False)
            return 2
        (errors if args.json else console).print(f"html: {args.html}", markup=False, soft_wrap=True)
    for gate in result.failed:
        errors.print(
            f"rlotel: --fail-if {gate.expression} failed: "
            f"{compare.describe(result.windows[gate.window])}",
            style="red",
            markup=False,
        )
    return 1 if result.failed else 0


def _stack(args: argparse.Namespace) -> int:
    from rlotel.offline.stack import write_stack

    directory = Path(args.dir)
    try:
        written = write_stack(directory, overwrite=args.force)
    except FileExistsError as error:
        errors.print(f"rlotel: {error} (--force replaces them)", style="red", markup=False)
        return 1
    except OSError as error:
        errors.print(f"rlotel: cannot write {directory}: {error}", style="red", markup=False)
        return 2
    config = directory / "collector" / "prometheus.yml"
    console.print(
        f"stack: {len(written)} files in {directory}: docker-compose.yml, dashboards/ (Grafana), "
        "collector/rules/ (Prometheus rules), collector/ (Collector, Prometheus, Alertmanager, "
        f"Tempo, Grafana provisioning), docs/runbooks.md\n"
        f"  start: docker compose -f {directory / 'docker-compose.yml'} up -d\n"
        f"  check: promtool check config {config}",
        markup=False,
        soft_wrap=True,
    )
    return 0


def _hangs(args: argparse.Namespace) -> int:
    """Exit 1 when a hang is present (a job watchdog's test), 0 when none is."""
    from rlotel.offline.hangs import hangs, render

    path = Path(args.dir)
    if not path.is_dir():
        errors.print(f"[red]rlotel: {path} is not a traces directory[/red]")
        return 2
    found = hangs(path)
    if not found:
        console.print(f"rlotel: no hang in {path}")
        return 0
    for line in render(found):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    return 1


def _sources_table(result) -> Table:
    """By data source: samples, mean reward and response tokens in base and new."""
    from rlotel.offline import compare

    kept = " / ".join(str(side.kept) for side in (result.base, result.new))
    table = Table(title=f"By data source, over {kept} kept steps (means weigh steps by samples)")
    for column in ("data source", "figure", "base", "new", "change"):
        table.add_column(column, justify="right" if column in ("base", "new", "change") else "left")
    for source, *cells in compare.source_rows(result):  # (base, new, change) per figure
        figures = ("samples", "mean reward", "mean response tokens")
        for index, figure in enumerate(figures):
            table.add_row(source if index == 0 else "", figure, *cells[3 * index : 3 * index + 3])
    return table


def _compare_table(result) -> Table:
    """Per window: base and new medians, the change, its 95 % interval, significance."""
    from rlotel.offline import compare
    from rlotel.offline.compare import format_interval, format_percent, format_value

    sides = (result.base, result.new)
    table = Table(
        title=f"Compare, medians over {' / '.join(str(s.kept) for s in sides)} kept steps; "
        f"bottleneck {' → '.join(s.bottleneck for s in sides)}",
        caption=f"base {result.base.source} · new {result.new.source}",
    )
    for column in ("window", "base", "new", "change", "95 % interval", "sig."):
        table.add_column(column, justify="left" if column == "window" else "right", no_wrap=True)
    failed = {gate.window for gate in result.failed}
    for w in result.windows.values():
        table.add_row(
            w.name,
            format_value(w.base, w.unit),
            format_value(w.new, w.unit),
            "n/a" if w.change is None else format_percent(w.change),
            "" if w.ci95 is None else format_interval(w.ci95),
            compare.significance(w, failed),
            style="bold red" if w.name in failed else ("yellow" if w.significant else None),
        )
    return table


def _verdict_summary(verdicts: list[Verdict]) -> str:
    """Bottleneck verdicts of a range of steps: how often each, then the last one in full."""
    counts = Counter(v.label for v in verdicts)
    last = verdicts[-1]
    lines = [
        "bottleneck: " + ", ".join(f"{label} ×{n}" for label, n in counts.most_common()),
        f"  last step: {last.label} ({last.confidence} confidence, "
        f"{last.share:.0%} of the step) → read next: {last.next_read}",
    ]
    for window, trend in last.trends.items():
        lines.append(
            f"  trend: {window} ×{trend['ratio']} vs trailing median"
            + (f" — {trend['attribution']}" if "attribution" in trend else "")
        )
    return "\n".join(lines)


def _ledger_table(steps, title: str | None = None) -> Table:
    """Per phase: mean seconds, share of step, per-token ms (verl's numbers)."""
    title = title or f"{len(steps)} steps"
    table = Table(title=f"Step ledger, {title} (means over {len(steps)} steps)")
    moved = any(_moves_of(s) for s in steps)
    columns = ("phase", "seconds", "share of step", "per-token ms")
    for column in (*columns, "data movement") if moved else columns:
        table.add_column(
            column, justify="left" if column in ("phase", "data movement") else "right"
        )
    step_mean = sum(s.timing_raw["step"] for s in steps) / len(steps)
    names = list(dict.fromkeys(n for s in steps for n in s.timing_raw if n != "step"))
    for name in [*names, "step"]:
        values = [s.timing_raw.get(name, 0.0) for s in steps]
        mean = sum(values) / len(values)
        key = voc.TIMING_PER_TOKEN_MS + name
        per_token = [s.metrics[key] for s in steps if key in s.metrics]
        row = [
            name,
            f"{mean:.4f}",
            f"{mean / step_mean:.1%}",
            f"{sum(per_token) / len(per_token):.4f}" if per_token else "",
        ]
        if moved:
            row.append(_data_movement(steps, name))
        table.add_row(*row)
    return table


def _moves_of(step) -> dict[str, dict[str, float]]:
    """A step's data movement by window, where its record has facts (a run read back; the
    demo's own step results have none)."""
    facts = getattr(step, "facts", None)
    return facts.data_movement if facts is not None else {}


def _data_movement(steps, window: str) -> str:
    """A window's worker-group calls, mean per step: data-movement seconds, the stage that
    took longest, the bytes sent and returned ("" where it called none)."""
    totals: dict[str, float] = {}
    for step in steps:
        for key, value in _moves_of(step).get(window, {}).items():
            totals[key] = totals.get(key, 0.0) + value / len(steps)
    if not totals:
        return ""
    stage = max(dm.MOVING, key=lambda name: totals.get(f"{name}_s", 0.0))
    moved = sum(totals.get(f"{d}_bytes", 0.0) for d in dm.DIRECTIONS) / 1e6
    return (
        f"{dm.moving_seconds(totals):.4f} ({stage} {totals.get(f'{stage}_s', 0.0):.4f}, "
        f"{moved:.3g} MB; work {totals.get(f'{dm.WORK}_s', 0.0):.4f})"
    )


def _goodput_table(steps) -> Table:
    """Per step kind of number: goodput, idle ratio per role, staleness (means over steps)."""
    table = Table(title=f"Goodput, idle and staleness (means over {len(steps)} steps)")
    for column in ("measure", "mean", "last step"):
        table.add_column(column, justify="left" if column == "measure" else "right")
    keys = [
        ("goodput (productive ÷ role-seconds)", voc.GOODPUT),
        *((f"seconds {b}", f"{voc.BUCKET_SECONDS}{b}") for b in goodput.BUCKETS),
        *((f"idle ratio {r}", f"{voc.IDLE_RATIO}{r}") for r in (goodput.TRAINER, goodput.ROLLOUT)),
        ("staleness mean (steps)", voc.TRAJECTORY_STALENESS + "mean"),
        ("staleness max (steps)", voc.TRAJECTORY_STALENESS + "max"),
        ("oldest-version staleness, token-weighted", voc.STALENESS_WORST_TOKEN_WEIGHTED),
        *((f"discarded {r} (share)", f"{voc.SAMPLES_DISCARDED}{r}") for r in voc.DISCARD_REASONS),
        *((f"async bias KS {q}", f"{voc.ASYNC_BIAS_KS}{q}") for q in voc.BIAS_QUANTITIES),
        ("rollout occupancy (in flight ÷ peak)", voc.ROLLOUT_OCCUPANCY),
        ("rollout tail seconds", voc.ROLLOUT_TAIL_SECONDS),
    ]
    for label, key in keys:
        values = [s.metrics[key] for s in steps if key in s.metrics]
        if values:
            table.add_row(label, f"{sum(values) / len(values):.3f}", f"{values[-1]:.3f}")
    return table


def _step_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected steps like 2,3, got {text!r}") from None


def _count(text: str, minimum: int = 0) -> int:
    try:
        value = int(text)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected a whole number >= {minimum}, got {text!r}")
    return value


def _resamples(text: str) -> int:
    return _count(text, 1)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Each option's help ends with its default, where the default says something (not
    None, a flag's False or an empty list: the help says what happens then)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        default = action.default
        if (
            default is None
            or default is False
            or (isinstance(default, list | tuple) and not default)
        ):
            return action.help
        return super()._get_help_string(action)


def parser() -> argparse.ArgumentParser:
    """The command line: every command, its options and their defaults."""
    main_parser = argparse.ArgumentParser(
        prog="rlotel",
        description="OpenTelemetry spans, NVTX ranges and Prometheus metrics for RL training "
        "loops (verl-compatible): one command per task below; `rlotel COMMAND --help` for its "
        "options. A command whose optional dependency is missing says what to install, exit 2.",
        formatter_class=_HelpFormatter,
    )
    main_parser.add_argument("--version", action="version", version=f"rlotel {rlotel.__version__}")
    subparsers = main_parser.add_subparsers(
        title="commands", dest="command", required=True, metavar="COMMAND"
    )

    def add_command(name: str, **options: Any) -> argparse.ArgumentParser:
        options.setdefault("description", options["help"])
        return subparsers.add_parser(name, formatter_class=_HelpFormatter, **options)

    demo = add_command(
        "demo",
        help="run a tiny real GRPO loop, fully instrumented",
        description="Train a tiny GRPO loop on CPU, instrumented by rlotel; write "
        "runs/<run>/traces.jsonl, summary.json and report.html. Ctrl-C stops it at any "
        f"point: exit {EXIT_INTERRUPTED}, with the files written and those not written "
        "named; while serving (--serve-seconds, --serve) it stops serving, exit 0. Needs "
        f"torch: {INSTALL['torch']} (the CPU build; exit 2 without it).",
    )
    demo.add_argument("--steps", type=int, default=60, help="training steps")
    demo.add_argument("--seed", type=int, default=0, help="random seed")
    demo.add_argument("--run", default="demo", help="run name (label `run`)")
    demo.add_argument(
        "--addr",
        help="/metrics bind address (default: $OTEL_EXPORTER_PROMETHEUS_HOST, else 127.0.0.1)",
    )
    demo.add_argument(
        "--port",
        type=int,
        help="/metrics port, 0 = ephemeral (default: $OTEL_EXPORTER_PROMETHEUS_PORT, else 9464)",
    )
    demo.add_argument("--runs-dir", default="runs", help="where runs/<run>/traces.jsonl goes")
    serving = demo.add_mutually_exclusive_group()
    serving.add_argument(
        "--serve-seconds",
        type=float,
        default=0.0,
        metavar="N",
        help="keep /metrics up N seconds after training (Ctrl-C stops it: exit 0)",
    )
    serving.add_argument(
        "--serve", action="store_true", help="keep /metrics up after training until Ctrl-C"
    )
    demo.add_argument(
        "--peak-flops",
        type=float,
        default=448e9,
        help="device peak FLOP/s (default: %(default).3g)",
    )
    demo.add_argument(
        "--ray", action="store_true", help="generate in 2 Ray actors on a local cluster"
    )
    demo.add_argument(
        "--ppo-epochs", type=int, default=1, help="passes over the batch in update_actor"
    )
    demo.add_argument(
        "--async",
        dest="async_mode",
        action="store_true",
        help="rollout in a concurrent thread into a bounded buffer (weight versions, staleness)",
    )
    demo.add_argument(
        "--rollout-slowdown",
        type=float,
        default=1.0,
        help="with --async: F× the rollout's real work (a slow rollout starves the trainer)",
    )
    demo.add_argument(
        "--sample-spans",
        type=int,
        default=rlotel.Config.max_sample_spans,
        help="the slowest N trajectories per step get a span (with its turns, tool calls "
        "and reward); 256 spans every one",
    )
    demo.add_argument(
        "--max-staleness",
        type=_count,
        default=None,
        metavar="N",
        help="with --async: discard trajectories completing more than N weight versions "
        "behind the trainer (verl's staleness threshold; the async-bias statistics show it)",
    )
    demo.add_argument(
        "--profile-steps",
        type=_step_list,
        default=(),
        help="global steps to capture with torch.profiler, e.g. 2,3 (runs/<run>/profile)",
    )
    demo.add_argument("--hold-at", choices=POINTS, help=argparse.SUPPRESS)  # test hook
    demo.set_defaults(handler=_demo)
    analyze = add_command(
        "analyze", help="print the step ledger of a traces file or a verl FileLogger JSONL"
    )
    analyze.add_argument("path", help="traces.jsonl, verl's <experiment>.jsonl, or a directory")
    analyze.add_argument("--every", type=int, default=0, help="one table per N steps")
    analyze.set_defaults(handler=_analyze)
    replay = add_command(
        "replay", help="verl FileLogger JSONL → backfillable OpenMetrics + a traces file"
    )
    replay.add_argument("path", help="verl's <experiment>.jsonl ({'step': N, 'data': {...}})")
    replay.add_argument("--out", help="output directory (default: next to the file)")
    replay.add_argument("--run", help="run label (default: the file's name)")
    replay.add_argument(
        "--step-seconds", type=float, default=None, help="duration of steps without timing_s/step"
    )
    replay.set_defaults(handler=_replay)
    report = add_command("report", help="a self-contained HTML report of a run (works offline)")
    report.add_argument("path", help="run directory, traces.jsonl, or verl's <experiment>.jsonl")
    report.add_argument("-o", "--out", help="output file (default: report.html beside the input)")
    report.set_defaults(handler=_report)
    perfetto = add_command(
        "perfetto", help="spans + torch.profiler captures as one Chrome trace-event timeline"
    )
    perfetto.add_argument("path", help="run directory or traces.jsonl")
    perfetto.add_argument("-o", "--out", help="trace.json or trace.json.gz (default: beside)")
    perfetto.set_defaults(handler=_perfetto)
    compare = add_command(
        "compare", help="which window changed between two runs, with intervals; a CI gate"
    )
    compare.add_argument("base", help="run directory, traces file or directory, verl JSONL")
    compare.add_argument("new", help="the same kinds as BASE")
    compare.add_argument(
        "--skip",
        type=_count,
        default=None,
        help="warm-up steps dropped on each side (default: the first 10 %%, at least 1)",
    )
    compare.add_argument("--json", action="store_true", help="the result as JSON on stdout")
    compare.add_argument("--html", metavar="FILE", help="also write a self-contained HTML page")
    compare.add_argument(
        "--fail-if",
        action="append",
        default=[],
        metavar="EXPR",
        help="exit 1 when a significant change crosses it: step>+5%%, throughput<-5%% (repeatable)",
    )
    compare.add_argument("--resamples", type=_resamples, default=2000, help="bootstrap resamples")
    compare.set_defaults(handler=_compare)
    stack = add_command(
        "stack", help="write the shipped Grafana dashboards, alert rules and stack configs"
    )
    stack.add_argument("dir", help="directory to write into (created if missing)")
    stack.add_argument("--force", action="store_true", help="replace files already there")
    stack.set_defaults(handler=_stack)
    hang = add_command(
        "hangs", help="the phase a run is stuck in and its processes' stacks; exit 1 if hung"
    )
    hang.add_argument("dir", help="the traces directory (RLOTEL_TRACES_DIR)")
    hang.set_defaults(handler=_hangs)
    doctor = add_command(
        "doctor",
        help="which of rlotel's hooks attach on the verl, Ray, vLLM and torch installed here; "
        "exit 1 if one that applies does not",
    )
    doctor.add_argument(
        "--metrics",
        action="append",
        default=[],
        metavar="URL",
        help="a running job's /metrics (repeatable): which hooks fired and failed in it",
    )
    doctor.add_argument(
        "--traces",
        action="append",
        default=[],
        metavar="DIR",
        help="a job's traces directory (RLOTEL_TRACES_DIR; repeatable): the same, after it ended",
    )
    doctor.add_argument("--json", action="store_true", help="the facts as JSON, for scripts")
    doctor.set_defaults(handler=_doctor)
    return main_parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return _checked_path(args) or args.handler(args)
    except ModuleNotFoundError as error:  # an optional dependency a command reached
        module = (error.name or "").partition(".")[0]
        if module not in INSTALL:
            raise
        _say_install(f"rlotel {args.command}", module)
        return 2


def _doctor(args: argparse.Namespace) -> int:
    from rlotel.cli import doctor

    return doctor.main(args.metrics, args.traces, as_json=args.json)


def _checked_path(args: argparse.Namespace) -> int:
    """Non-zero (after one line) when a report/perfetto input does not exist."""
    if args.command in ("report", "perfetto") and not Path(args.path).exists():
        errors.print(f"[red]rlotel: {args.path} does not exist[/red]")
        return 2
    return 0
