"""The suite's real runs, started ahead: a run is minutes of mostly waiting (Ray, vLLM and
model start-up, one core of two busy), so the runs go one at a time in a thread of their
own from the end of collection on, while the rest of the suite runs; the tests that read
them run last (`tests/conftest.py` orders them) and wait for their run.

A test module declares each run it reads at import (`declare`), its fixture waits for it
(`finished`) and removes its directory when the module is done. Only the runs of selected
tests start, in the order their tests will need them; the inputs every run shares (the
tokenizer, model and data of `tests.e2e.assets`) are built first, once. A run that judges
time (`quiet`: the hang run's stall limits) starts only once the tests that read no run are
done (`rest_done`), so a busy machine does not decide what it measures; the tests marked
`timing` (a unit test that judges relative speed) run after every real run, for the same
reason.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.e2e.main_ppo import ENGINE_PYTHON, ROOT

Command = Callable[[Path, Path], list[str]]  # (its directory, the shared inputs) → argv
STOP_S = 30  # a run still going when the session ends is killed; its thread gets this long
# The runs yield the cores to the tests beside them, which wait on what they start (Ray's
# raylet must register within its fixed 30 s; a clean-clone suite beside a 2-rank run missed it).
NICE = ("nice", "-n", "5")


@dataclass(eq=False)
class RealRun:
    key: str  # the fixture that reads it (`name[param]` for a parametrized one)
    prefix: str  # of its directory in /tmp: short, Ray's socket paths stay below 108 bytes
    command: Command
    timeout_s: float
    quiet: bool = False  # judges time: runs after the rest of the suite, not beside it
    work: Path | None = None
    result: subprocess.CompletedProcess | None = None
    error: BaseException | None = None
    wall_s: float | None = None
    started_s: float | None = None  # after the runner started (the end of collection)
    done: threading.Event = field(default_factory=threading.Event)


RUNS: dict[str, RealRun] = {}
FIGURES: list[tuple[str, str]] = []  # (test, line): what the real runs showed


def figure(*parts: object) -> None:
    """Print what a real run showed and keep it for the suite's summary: pytest shows a
    passing test's output nowhere, and these figures are what a reader of a run wants."""
    line = " ".join(str(part) for part in parts)
    test = os.environ.get("PYTEST_CURRENT_TEST", "").split("::")[-1].removesuffix(" (call)")
    FIGURES.append((test, line))
    print(line)


def declare(
    key: str, prefix: str, command: Command, timeout_s: float, quiet: bool = False
) -> RealRun:
    RUNS[key] = RealRun(key, prefix, command, timeout_s, quiet)
    return RUNS[key]


rest_done = threading.Event()  # the tests that read no run have finished
rest_done_s: float | None = None  # when, after the runner started


def mark_rest_done() -> None:
    global rest_done_s
    if not rest_done.is_set() and _runner is not None:
        rest_done_s = time.monotonic() - _runner.began
    rest_done.set()


class Runner:
    """Builds the shared inputs, then runs `runs` one after the other in a daemon thread."""

    def __init__(self, runs: Sequence[RealRun]) -> None:
        self.runs = list(runs)
        self.began = time.monotonic()
        self.assets = Path(tempfile.mkdtemp(prefix="rl-assets-", dir="/tmp"))
        self._process: subprocess.Popen | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run_all, name="e2e-runs-ahead", daemon=True)
        self._thread.start()

    def _run_all(self) -> None:
        inputs = [str(ENGINE_PYTHON), "-m", "tests.e2e.assets", str(self.assets)]
        failed: BaseException | None = None
        try:
            made = self._run(inputs, 600)
            if made.returncode != 0:
                failed = RuntimeError(f"the e2e inputs failed: {made.stderr[-3000:]}")
        except BaseException as error:  # handed to every test that reads a run
            failed = error
        for run in self.runs:
            if run.quiet:
                rest_done.wait()
            if failed is not None:
                run.error = failed
            elif not self._stopping.is_set():
                run.work = Path(tempfile.mkdtemp(prefix=run.prefix, dir="/tmp"))
                started = time.monotonic()
                run.started_s = started - self.began
                command = [*NICE, *run.command(run.work, self.assets)]
                try:
                    run.result = self._run(command, run.timeout_s)
                except BaseException as error:  # handed to the test that reads the run
                    run.error = error
                run.wall_s = time.monotonic() - started
            run.done.set()

    def _run(self, argv: list[str], timeout_s: float) -> subprocess.CompletedProcess:
        if not ENGINE_PYTHON.exists():
            raise RuntimeError(f"{ENGINE_PYTHON} is missing: `make engine-venv` builds it")
        process = subprocess.Popen(
            argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True,
        )  # fmt: skip
        self._process = process
        try:
            out, err = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._kill(process)
            out, err = process.communicate()
            raise subprocess.TimeoutExpired(argv, timeout_s, out, err) from None
        return subprocess.CompletedProcess(argv, process.returncode, out, err)

    @staticmethod
    def _kill(process: subprocess.Popen) -> None:
        with contextlib.suppress(ProcessLookupError):  # the namespace's processes with it
            os.killpg(process.pid, signal.SIGKILL)

    def stop(self) -> None:
        """At the session's end: kill what still runs, remove what the runs left."""
        self._stopping.set()
        rest_done.set()
        if self._process is not None and self._process.poll() is None:
            self._kill(self._process)
        self._thread.join(STOP_S)
        for run in self.runs:
            if run.work is not None:
                shutil.rmtree(run.work, ignore_errors=True)
        shutil.rmtree(self.assets, ignore_errors=True)


_runner: Runner | None = None


def start(keys: Sequence[str]) -> None:
    """Start the runs of `keys`, in that order (the order their tests run in)."""
    global _runner
    _runner = Runner([RUNS[key] for key in keys])


def stop() -> None:
    if _runner is not None:
        _runner.stop()


def walls() -> list[tuple[str, float | None, float | None]]:
    """Each run's (key, start and wall seconds): None where it did not start or end."""
    runs = _runner.runs if _runner is not None else []
    return [(run.key, run.started_s, run.wall_s) for run in runs]


def finished(key: str) -> RealRun:
    """The run of `key`, once it has ended (its tests run after the rest of the suite)."""
    run = RUNS[key]
    if _runner is None or run not in _runner.runs:
        raise RuntimeError(f"the real run {key!r} was not started at collection")
    run.done.wait()
    if run.error is not None:
        raise run.error
    if run.result is None:
        raise RuntimeError(f"the real run {key!r} did not run: the session is ending")
    return run


def work_of(key: str) -> Iterator[Path]:
    """A module fixture's body: the run's directory, removed when the module is done."""
    run = finished(key)
    assert run.work is not None
    try:
        yield run.work
    finally:
        shutil.rmtree(run.work, ignore_errors=True)
