"""verl's own profiler outputs, found on disk and linked from the windows they explain.

verl writes its workers' torch traces under `global_profiler.save_path`, named by
`build_trace_basename` (`{worker role}_{stage}_step{N}_rank{R}[-of-W]…_pid{P}_{time}[_mbA-B]`:
the stage is verl's annotation, `actor_update`, or `train` for a whole-step capture), the
rollout engines' traces in one directory per replica (`agent_loop_rollout_replica_{r}/`, or
moved up as `rollout-replica{r}[-globalrank{g}]_…` with `relocate_results`), torch_memory
pickles and nsys reports. Every span that links a capture links the same span: its ids
follow from the file name (`capture_ids`), so the worker that wrote it and the trainer that
found it need not talk.

- Trainer (a ledger hook, `Config.step_hooks=[discover]`): holds each flagged step until the
  next step starts (a continuous capture: until its last step ended), then links what verl
  wrote: from the step span (every capture of the step; a continuous capture from each step
  it covers), a worker's capture from the trainer phase it was written in, an engine's from
  `gen`; the trainer publishes the capture spans.
- Worker (`CallWatch`, from `verl_workers`): a worker call while its profiler is on links the
  captures this process wrote during the call from the call's span; a rollout server's
  `stop_profile` links its engine's, with the token window. verl's `finish_hook_cmd` run is
  an event on the span of the call that ran it (`patch_profiler`).

The core never imports this module.
"""

from __future__ import annotations

import contextvars
import os
import re
import shlex
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlotel.base import ids
from rlotel.integrations import service
from rlotel.integrations.registered import MEMORY_OOM, PROFILE_FINISH, RAY_ACTOR_CLASS
from rlotel.record.capture import Capture
from rlotel.schema import attributes as attr
from rlotel.schema import vocabulary as voc

if TYPE_CHECKING:
    from rlotel.record.ledger import HookServices

ROLLOUT_DIR = "agent_loop_rollout_replica_"  # verl's `rollout_trace_dir`
_RELOCATED = re.compile(r"^rollout-replica(\d+)(?:-globalrank(\d+))?_")
_RANK = re.compile(r"^rank(\d+)(?:-of-(\d+))?$")
_STEP = re.compile(r"^step(\d+)$")
_MINI_BATCH = re.compile(r"^mb(\d+)(?:-(\d+))?$")
TRACE_SUFFIXES = (".json.gz", ".json")
ROLLOUT_ROLE = "rollout"


@dataclass(frozen=True)
class VerlName:
    """What verl's `build_trace_basename` put in a worker trace's file name."""

    prefix: str | None  # the worker role verl gave (`actor-rollout`)
    stage: str | None  # `actor_update`, `actor_compute_log_prob`, `train`
    step: int
    rank: int
    pid: int | None
    mini_batches: tuple[int, int] | None

    @property
    def role(self) -> str:
        if not self.prefix:
            return "worker"
        return voc.verl_worker_role(self.prefix.replace("-", "_"))


def parse_verl_name(name: str) -> VerlName | None:
    """The parts of a verl worker trace's name; None for any other file."""
    if not name.endswith(TRACE_SUFFIXES):
        return None
    parts = name.removesuffix(".gz").removesuffix(".json").split("_")
    at = next((i for i, part in enumerate(parts) if _STEP.match(part)), None)
    if at is None or at > 2 or at + 1 >= len(parts):
        return None
    rank = _RANK.match(parts[at + 1])
    if rank is None:
        return None
    before = parts[:at]  # verl puts the worker role first, the stage second
    prefix = before[0] if before else None
    stage = before[1] if len(before) == 2 else None
    pid = next((int(p[3:]) for p in parts[at + 2 :] if re.fullmatch(r"pid\d+", p)), None)
    mini_batches = None
    window = _MINI_BATCH.match(parts[-1])
    if window is not None:
        first = int(window[1])
        mini_batches = (first, int(window[2]) if window[2] else first)
    return VerlName(
        prefix,
        stage.replace("-", "_") if stage else None,
        int(_STEP.match(parts[at])[1]),
        int(rank[1]),
        pid,
        mini_batches,
    )


def engine_traces(save_dir: Path, replica: int | None = None) -> list[tuple[int, int | None, Path]]:
    """(replica, global rank or None, path) of the rollout engines' traces: in verl's
    per-replica directories and those `relocate_results` moved up into `save_dir`."""
    found: list[tuple[int, int | None, Path]] = []
    if not save_dir.is_dir():
        return found
    pattern = f"{ROLLOUT_DIR}{'*' if replica is None else replica}"
    for directory in sorted(save_dir.glob(pattern)):
        number = directory.name.removeprefix(ROLLOUT_DIR)
        if directory.is_dir() and number.isdigit():
            for path in sorted(directory.iterdir()):
                if path.name.endswith(TRACE_SUFFIXES):
                    found.append((int(number), None, path))
    for path in sorted(save_dir.glob("rollout-replica*")):
        moved = _RELOCATED.match(path.name)
        if moved and (replica is None or int(moved[1]) == replica):
            found.append((int(moved[1]), int(moved[2]) if moved[2] else None, path))
    return found


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:  # moved (relocated) or removed meanwhile
        return None


def find_verl_captures(
    save_dir: Path, step: int, since_epoch_s: float | None = None
) -> list[tuple[str, Path]]:
    """(tool, path) of verl's worker outputs written for `step` under `save_dir`.

    torch traces and torch_memory pickles carry the step in their names; nsys reports
    (`*.nsys-rep`, named by worker pid) do not, so they count for the step when written
    after `since_epoch_s` (the step's start). The engines' traces: `engine_traces`.
    """
    found: list[tuple[str, Path]] = []
    if not save_dir.is_dir():
        return found
    for path in sorted(save_dir.glob("*.json*")):
        parsed = parse_verl_name(path.name)
        if parsed is not None and parsed.step == step:
            found.append(("torch", path))
    # verl's memory snapshots: `step{N}/`, or `steps{A}-{N}/` written at the last step of a
    # window of `memory_snapshot_num_steps` steps
    for window in (f"step{step}", *(p.name for p in save_dir.glob(f"steps*-{step}"))):
        for path in sorted((save_dir / window).glob("torch_memory_rank*.pickle")):
            found.append(("torch_memory", path))
    if since_epoch_s is not None:
        for path in sorted(save_dir.rglob("*.nsys-rep")):
            mtime = _mtime(path)
            if mtime is not None and mtime >= since_epoch_s:
                found.append(("nsys", path))
    return found


# --- the trainer: captures linked from its steps and phases ---------------------------------


def _perf_ns(epoch_s: float) -> int:
    """A wall-clock time on this process's perf_counter clock (the ledger's)."""
    return int(epoch_s * 1e9) - (time.time_ns() - time.perf_counter_ns())


def _epoch_s(perf_ns: int) -> float:
    return (perf_ns + time.time_ns() - time.perf_counter_ns()) / 1e9


def _innermost(steps: list[Any], at_ns: int) -> tuple[Any, Any] | None:
    """(step, phase) of the innermost closed phase of `steps` open at `at_ns`."""
    best = None
    for step in steps:
        for record in step.trace.records:
            if not (record.end_ns and record.start_ns <= at_ns <= record.end_ns):
                continue
            if best is None or record.end_ns - record.start_ns < best[1].seconds * 1e9:
                best = (step, record)
    return best


def _named(steps: list[Any], name: str, at_ns: int | None) -> tuple[Any, Any] | None:
    """(step, phase) of the phase called `name` that holds `at_ns` (else the first)."""
    found = [(s, r) for s in steps for r in s.trace.records if r.name == name and r.end_ns]
    if at_ns is not None:
        holding = [(s, r) for s, r in found if r.start_ns <= at_ns <= r.end_ns]
        found = holding or found
    return found[0] if found else None


def _context(step: Any, record: Any) -> tuple[int, int]:
    if not record.span_id:  # the span builder keeps an id drawn before export
        record.span_id = ids.span_id()
    return step.trace.trace_id, record.span_id


class VerlCaptureDiscovery:
    """Ledger hooks: hold flagged steps, then link verl's captures for them."""

    def __init__(
        self,
        save_dir: Path,
        steps: frozenset[int],
        role: str,
        rank: int,
        publish_capture: Callable[[Capture], None],
        release: Callable[[list[Any]], None],
        continuous: bool = False,
        token_window: tuple[int | None, int | None] | None = None,
    ) -> None:
        self._save_dir = save_dir.absolute()  # verl's is relative to the workers' cwd
        self._flagged = steps
        self._role = role
        self._rank = rank
        self._publish_capture = publish_capture
        self._release = release
        self._continuous = continuous
        self._token_window = token_window
        self._pending: list[Any] = []
        self._open_block = False  # a continuous capture whose last step is still to come
        self._linked: set[Path] = set()  # outputs already linked (some carry no step)

    def on_step_start(self, number: int) -> None:
        if self._pending and not self._open_block:
            self.flush()

    def on_step_end(self, step: Any) -> None:
        if step.number in self._flagged:
            step.held = True
            self._pending.append(step)
            self._open_block = self._continuous and step.number + 1 in self._flagged

    def flush(self) -> None:
        held, self._pending, self._open_block = self._pending, [], False
        if not held:
            return
        if self._continuous:  # one capture for each run of consecutive flagged steps
            blocks: list[list[Any]] = []
            for step in held:
                if blocks and step.number == blocks[-1][-1].number + 1:
                    blocks[-1].append(step)
                else:
                    blocks.append([step])
        else:
            blocks = [[step] for step in held]
        for block in blocks:
            captures = self._block_captures(block)
            for capture in captures:
                self._publish_capture(capture)
            for step in block:
                step.captures.extend(captures)
                step.held = False
        self._release(held)

    def _block_captures(self, block: list[Any]) -> list[Capture]:
        first, last = block[0], block[-1]
        steps = (first.number, last.number)
        since = _epoch_s(first.record.start_ns)
        captures: list[Capture] = []
        for number in range(first.number, last.number + 1):
            for tool, path in find_verl_captures(self._save_dir, number, since):
                if path in self._linked:
                    continue
                self._linked.add(path)
                parsed = parse_verl_name(path.name) if tool == "torch" else None
                if parsed is None:
                    capture = Capture.of_file(tool, path, steps, self._role, self._rank)
                else:
                    covered = steps if parsed.stage == "train" or self._continuous else None
                    capture = Capture.of_file(
                        tool,
                        path,
                        covered or (parsed.step, parsed.step),
                        parsed.role,
                        parsed.rank,
                        mini_batches=parsed.mini_batches,
                        stage=parsed.stage,
                    )
                written = _mtime(path)
                at = _perf_ns(written) if written is not None else None
                window = _innermost(block, at) if at is not None and parsed else None
                self._place(capture, window, block)
                captures.append(capture)
        for replica, rank, path in engine_traces(self._save_dir):
            written = _mtime(path)
            if path in self._linked or written is None or written < since:
                continue
            self._linked.add(path)
            at = _perf_ns(written)
            window = _named(block, voc.GEN, at)
            number = window[0].number if window else last.number
            capture = Capture.of_file(
                "torch",
                path,
                (number, number),
                ROLLOUT_ROLE,
                replica if rank is None else rank,
                replica=replica,
                token_window=self._token_window,
            )
            self._place(capture, window, block)
            captures.append(capture)
        return captures

    @staticmethod
    def _place(capture: Capture, window: tuple[Any, Any] | None, block: list[Any]) -> None:
        """The capture's span covers the window it explains (the steps when none is known)."""
        if window is not None:
            step, record = window
            capture.phase_context = _context(step, record)
            capture.start_ns, capture.end_ns = record.start_ns, record.end_ns
        else:
            capture.start_ns, capture.end_ns = block[0].record.start_ns, block[-1].record.end_ns


def discover(services: HookServices) -> VerlCaptureDiscovery | None:
    """`Config.step_hooks` factory: link verl's captures when the profile names verl's
    `global_profiler.save_path` (`ProfileConfig.discover_dir`); None otherwise."""
    profile = services.profile
    if profile is None or profile.discover_dir is None:
        return None
    window = None
    if profile.token_start is not None or profile.token_end is not None:
        window = (profile.token_start, profile.token_end)
    return VerlCaptureDiscovery(
        profile.discover_dir,
        frozenset(profile.steps),
        profile.role,
        profile.rank,
        services.publish_capture,
        services.release,
        profile.continuous,
        window,
    )


# --- a worker: its own calls link what it wrote ---------------------------------------------


def watch_call(instance: Any, name: str) -> CallWatch | None:
    """A `CallWatch` of this worker call when verl's profiler is on; never raises."""
    try:
        RAY_ACTOR_CLASS.fault()
        return CallWatch.begin(instance, name)
    except Exception as error:
        RAY_ACTOR_CLASS.failed(error)
        return None


@dataclass
class _Profiled:
    """One enabled verl profiler of a worker (a role's `DistProfiler`, or a rollout server's
    `profiler_controller`)."""

    profiler: Any
    save_dir: Path
    replica: int | None = None  # a rollout server: the engine's traces are its replica's
    token_window: tuple[int | None, int | None] | None = None


_current: contextvars.ContextVar[CallWatch | None] = contextvars.ContextVar(
    "rlotel_capture_call", default=None
)
_LOADED_S = time.time()  # a start_profile not traced: the traces written since this process ran


class EngineWindows:
    """A rollout server's engine profile windows in this process: when each server's
    `start_profile` was called (vLLM's profiler may stop and write by itself, once its token
    window is done), and which of the engine's traces are linked already."""

    def __init__(self) -> None:
        self._started: dict[int, float] = {}  # id of the server → its start_profile's time
        self._linked: set[Path] = set()

    def started(self, server: Any, at_s: float) -> None:
        self._started[id(server)] = at_s

    def since(self, server: Any) -> float:
        """Its open window's start (closing it), or this process's start when untraced."""
        return self._started.pop(id(server), _LOADED_S)

    def first_link(self, path: Path) -> bool:
        """True the first time, once per trace file."""
        if path in self._linked:
            return False
        self._linked.add(path)
        return True


ENGINE_WINDOWS = EngineWindows()


@dataclass
class CallWatch:
    """One worker call on a process whose verl profiler is enabled: at its end, the
    captures written during it are linked from its span (and verl's finish hook, run inside
    it, is an event there)."""

    name: str
    profiled: list[_Profiled]
    since_s: float = field(default_factory=time.time)
    recording: bool = False
    events: list[tuple[str, int, dict[str, Any]]] = field(default_factory=list)
    token: Any = None
    engine_since_s: float = 0.0  # a rollout server's stop_profile: when it started the engine

    @classmethod
    def begin(cls, instance: Any, name: str) -> CallWatch | None:
        """None (at the cost of a few attribute reads) unless a profiler of `instance` is on."""
        profiled = _enabled_profilers(instance)
        if not profiled:
            return None
        watch = cls(name, profiled)
        watch.recording = any(_this_step(p.profiler) for p in profiled)
        watch.token = _current.set(watch)
        if name == voc.START_PROFILE and any(p.replica is not None for p in profiled):
            ENGINE_WINDOWS.started(instance, watch.since_s)
        elif watch._stopping():  # the engine may write before (its token window closed)
            watch.engine_since_s = ENGINE_WINDOWS.since(instance)
        return watch

    def end(self, phase: Any) -> None:
        """Before the call's phase closes: its trace (`phase.trace`) takes the links."""
        _current.reset(self.token)
        trace = getattr(phase, "trace", None)
        if trace is None:
            return
        captures = self.captures() if self.recording or self._stopping() else []
        if captures:
            trace.captures = (*trace.captures, *captures)
        if self.events:
            trace.events = (*trace.events, *self.events)

    def _stopping(self) -> bool:
        return self.name == voc.STOP_PROFILE

    def captures(self) -> list[Capture]:
        pid = f"_pid{os.getpid()}_"
        found: list[Capture] = []
        for profiled in self.profiled:
            for path in sorted(profiled.save_dir.glob(f"*{pid}*")):
                parsed = parse_verl_name(path.name)
                written = _mtime(path)
                if parsed is None or written is None or written < self.since_s:
                    continue
                found.append(
                    Capture.of_file(
                        "torch",
                        path,
                        (parsed.step, parsed.step),
                        parsed.role,
                        parsed.rank,
                        mini_batches=parsed.mini_batches,
                        stage=parsed.stage,
                        size=_size(path),
                    )
                )
            if profiled.replica is None or not self._stopping():
                continue
            for replica, rank, path in engine_traces(profiled.save_dir, profiled.replica):
                written = _mtime(path)
                if written is None or written < self.engine_since_s:
                    continue
                if not ENGINE_WINDOWS.first_link(path):
                    continue
                found.append(
                    Capture.of_file(  # its step: on the trainer's span (the `gen` it covers)
                        "torch",
                        path,
                        None,
                        ROLLOUT_ROLE,
                        replica if rank is None else rank,
                        replica=replica,
                        token_window=profiled.token_window,
                        size=_size(path),
                    )
                )
        return found


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _this_step(profiler: Any) -> bool:
    try:
        return bool(profiler.check_this_step())
    except Exception:
        return False


def _profilers_of(instance: Any) -> Iterable[tuple[Any, int | None]]:
    """(verl profiler, replica or None) of a worker instance and the roles it hosts."""
    yield getattr(instance, "profiler", None), None
    replica = getattr(instance, "replica_rank", None)
    yield getattr(instance, "profiler_controller", None), replica
    workers = getattr(instance, "worker_dict", None)
    if isinstance(workers, dict):
        for worker in workers.values():
            yield getattr(worker, "profiler", None), None


def _enabled_profilers(instance: Any) -> list[_Profiled]:
    profiled: list[_Profiled] = []
    for profiler, replica in _profilers_of(instance):
        check = getattr(profiler, "check_enable", None)
        if check is None or not check():
            continue
        save_path = getattr(getattr(profiler, "config", None), "save_path", None)
        if not save_path:
            continue
        window = None
        tool_config = getattr(profiler, "tool_config", None)
        start = getattr(tool_config, "profile_token_start", None)
        end = getattr(tool_config, "profile_token_end", None)
        if start is not None or end is not None:
            window = (start, end)
        if not isinstance(replica, int) or isinstance(replica, bool):
            replica = None
        profiled.append(_Profiled(profiler, Path(save_path).absolute(), replica, window))
    return profiled


# --- verl's finish hook -----------------------------------------------------------------------


def command_name(command: str) -> str:
    """The program a shell command runs, without its arguments (they may hold secrets) or
    leading `VAR=value` assignments."""
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    words = [w for w in words if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", w)]
    return os.path.basename(words[0]) if words else ""


_spied = threading.local()  # the Popen verl's finish hook started on this thread


class SubprocessSpy:
    """verl's profiler module's `subprocess`: the same, except that it keeps the process
    the finish hook starts (verl prints its exit status but returns nothing)."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def Popen(self, *args: Any, **kwargs: Any) -> Any:
        process = self._real.Popen(*args, **kwargs)
        _spied.process = process
        return process


def finish_command(original: Callable[..., Any]) -> Callable[..., Any]:
    """`DistProfiler._run_finish_command(self, cmd, save_path)`: verl's run of
    `finish_hook_cmd`, recorded as an event of the worker call that ran it (its program's
    name, exit status and duration) and counted when it failed."""

    def _run_finish_command(self: Any, cmd: Any, *args: Any, **kwargs: Any) -> Any:
        _spied.process = None
        started = time.time_ns()
        try:
            return original(self, cmd, *args, **kwargs)
        finally:
            PROFILE_FINISH.attempt(_record_finish, cmd, started)

    return _run_finish_command


def _record_finish(command: Any, started_ns: int) -> None:
    import rlotel

    process, _spied.process = getattr(_spied, "process", None), None
    status = getattr(process, "returncode", None)
    attributes: dict[str, Any] = {
        attr.PROFILE_HOOK_COMMAND: command_name(str(command)),
        attr.PROFILE_HOOK_SECONDS: round((time.time_ns() - started_ns) / 1e9, 6),
    }
    if isinstance(status, int):
        attributes[attr.PROFILE_HOOK_EXIT_STATUS] = status
    watch = _current.get()
    if watch is not None:
        watch.events.append((attr.PROFILE_HOOK_EVENT, started_ns, attributes))
    tel = rlotel.current()
    if tel is not None:
        PROFILE_FINISH.fired()
        if status != 0:
            service.of(tel).dropped(
                "profile",
                "hook_failed",
                f"verl's finish_hook_cmd {attributes[attr.PROFILE_HOOK_COMMAND]} "
                + (f"exited {status}" if isinstance(status, int) else "did not start"),
            )


def traced_oom(original: Callable[..., Any]) -> Callable[..., Any]:
    """`TorchMemoryProfiler._on_out_of_memory(device, alloc, total, free)`: verl dumps the
    allocator (`oom_{time}/torch_memory_oom_rank{R}_pid{P}.pickle`); the snapshot becomes an
    event of the worker call that was running, the span open when it was written."""

    def _on_out_of_memory(self: Any, *args: Any, **kwargs: Any) -> Any:
        started_ns = time.time_ns()
        try:
            return original(self, *args, **kwargs)
        finally:
            MEMORY_OOM.attempt(_record_oom, self, started_ns)

    return _on_out_of_memory


def _record_oom(profiler: Any, started_ns: int) -> None:
    import rlotel

    save_dir = Path(getattr(profiler.config, "save_path", None) or "outputs/profile")
    written = [
        path
        for path in save_dir.glob(f"oom_*/torch_memory_oom_rank*_pid{os.getpid()}.pickle")
        if path.stat().st_mtime_ns >= started_ns - 1_000_000_000  # this OOM's (1 s slack)
    ]
    watch = _current.get()
    tel = rlotel.current()
    if tel is not None:
        MEMORY_OOM.fired()
    for path in written:
        attributes = {attr.PROFILE_PATH: str(path), attr.PROFILE_SIZE: path.stat().st_size}
        if watch is not None:
            watch.events.append((attr.PROFILE_OOM_EVENT, started_ns, attributes))
        elif tel is not None:  # outside any worker call: said, not lost
            service.of(tel).dropped("profile", "oom_outside_call", f"verl's OOM snapshot {path}")
