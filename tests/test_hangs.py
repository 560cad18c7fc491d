"""`rlotel hangs DIR`: names the stuck phase, its process and the user's blocked frame from a
traces directory while the run hangs (exit 1), and says no hang once the phase closed."""

from __future__ import annotations

import threading
import time

from rlotel.cli import commands as cli
from rlotel.schema import attributes as attr


def wait_for(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def reward_that_never_answers(release: threading.Event) -> None:
    """A stand-in for the user's reward calling a sandbox that hangs."""
    release.wait(30)


def test_a_hung_phase_is_named_with_its_stack_until_it_closes(
    make_tel, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("RLOTEL_TRACES_DIR", str(tmp_path))
    tel = make_tel(stall_after_s=0.3, resource_attributes={attr.ROLE: "trainer", attr.RANK: 0})
    release = threading.Event()

    def train() -> None:
        with tel.step(2), tel.phase("gen"):
            reward_that_never_answers(release)

    trainer = threading.Thread(target=train, name="trainer")
    trainer.start()
    try:
        wait_for(lambda: tel.stalled)
        assert tel.flush(10)  # the partial span reaches the traces file
        capsys.readouterr()
        assert cli.main(["hangs", str(tmp_path)]) == 1
        out = capsys.readouterr().out
        assert "HANG: phase 'gen' in step 2" in out
        assert "role=trainer rank=0" in out and "pid=" in out
        (thread,) = [line for line in out.splitlines() if line.startswith("  thread trainer:")]
        assert thread.endswith("in reward_that_never_answers")  # the user's frame first
        assert "[stdlib]" in out and "[user]" in out  # then the frames, each marked
    finally:
        release.set()
        trainer.join(10)
    assert tel.flush(10)  # gen closed: its complete span follows
    capsys.readouterr()
    assert cli.main(["hangs", str(tmp_path)]) == 0
    assert "no hang" in capsys.readouterr().out


def test_a_directory_without_stalls_has_no_hang_and_a_missing_one_is_an_error(tmp_path, capsys):
    assert cli.main(["hangs", str(tmp_path)]) == 0
    assert cli.main(["hangs", str(tmp_path / "missing")]) == 2


def test_a_worker_call_that_stops_progressing_writes_its_own_stack(
    make_tel, tmp_path, monkeypatch, capsys
):
    """The same rule runs in every process: a worker's call (a remote phase) is judged by
    its own progress and its stacks land in the same directory."""
    monkeypatch.setenv("RLOTEL_TRACES_DIR", str(tmp_path))
    tel = make_tel(stall_after_s=0.3, resource_attributes={attr.ROLE: "reward", attr.RANK: 3})
    caller = {"traceparent": f"00-{'ab' * 16}-{'cd' * 8}-01"}  # the driver's phase
    release = threading.Event()

    def serve() -> None:
        with tel.phase("compute_score", context=caller):
            reward_that_never_answers(release)

    worker = threading.Thread(target=serve, name="reward-call")
    worker.start()
    try:
        wait_for(lambda: tel.stalled)
        capsys.readouterr()
        assert cli.main(["hangs", str(tmp_path)]) == 1
        out = capsys.readouterr().out
        assert "HANG: phase 'compute_score' open since" in out
        assert "role=reward rank=3" in out
        assert "thread reward-call: stuck at" in out
    finally:
        release.set()
        worker.join(10)


def test_a_collective_some_ranks_entered_names_the_ranks_that_did_not(tmp_path, capsys):
    """Two of a group's three ranks stuck in one all_reduce, the third elsewhere (each
    process's stacks as the stall watch writes them): `rlotel hangs` names the collective,
    the ranks in it and the rank that never entered (where to look)."""
    import json

    def stacks(rank: int, waiting: str | None) -> dict:
        thread = {
            "thread": "MainThread",
            "frames": [{"where": "train.py:9 in step", "kind": "user"}],
        }
        if waiting:
            thread["waiting"] = waiting
        return {
            "phase": "update_actor",
            "since_unix_s": 1.0e9,
            "last_progress_unix_s": 1.0e9,
            "quiet_s": 30.0,
            "evidence": {"role": "actor", "rank": rank, "step": 4},
            "threads": [thread],
            "trace_id": "ab" * 16,
            "span_id": f"{rank + 1:016x}",
        }

    for rank, waiting in (
        (0, "all_reduce on group [0, 1, 2] as rank 0, entered 31.0 s ago"),
        (1, None),  # stuck in its own computation, never reached the collective
        (2, "all_reduce on group [0, 1, 2] as rank 2, entered 30.5 s ago"),
    ):
        line = json.dumps(stacks(rank, waiting))
        (tmp_path / f"actor-{rank}-{100 + rank}.stacks").write_text(line + "\n")
    assert cli.main(["hangs", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "    waiting in all_reduce on group [0, 1, 2] as rank 2, entered 30.5 s ago" in out
    assert (
        "COLLECTIVE: all_reduce on group [0, 1, 2]: entered by rank(s) [0, 2]; not entered by [1]"
    ) in out
