"""fork after init, exiting mid-step, SIGTERM and busy ports: no deadlock, no duplicate
export, nothing lost, and a clear error or the configured fallback."""

from __future__ import annotations

import contextlib
import logging
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

import rlotel
from tests.helpers import file_spans, scrape

FORK = textwrap.dedent(
    """
    import os, sys, time
    import rlotel
    tel = rlotel.init(run="fork", prometheus_port=0, traces_file=sys.argv[1])
    with tel.step(1), tel.phase("gen"):
        pass
    tel.log({"loss": 1.0}, step=1)
    pid = os.fork()  # e.g. a dataloader worker, while the publisher thread is running
    if pid == 0:
        for number in range(100, 103):  # the child keeps timing; nothing leaves it
            with tel.step(number) as step, tel.phase("gen"):
                tel.record_samples(generate_sequences=[0.1, 0.2])
            tel.log({"loss": 2.0}, step=number)
            assert step.timing_raw["gen"] > 0
        sys.exit(0)  # runs atexit in the child: must not flush the parent's data again
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        sys.exit("forked child deadlocked")
    assert os.waitstatus_to_exitcode(status) == 0, status
    with tel.step(2), tel.phase("gen"):
        pass
    """
)

CRASH = textwrap.dedent(
    """
    import sys
    import rlotel
    tel = rlotel.init(run="crash", prometheus_port=None, traces_file=sys.argv[1])
    with tel.step(1), tel.phase("gen"):
        pass
    step = tel.step(2)
    step.__enter__()
    with tel.phase("gen"):
        pass
    tel.phase("update_actor").__enter__()
    # the interpreter exits here, mid-step and mid-phase (no shutdown call)
    """
)


PORT_AFTER_FORK = textwrap.dedent(
    """
    import os, signal, socket, sys, time
    import rlotel
    tel = rlotel.init(run="port", prometheus_port=0)
    port = int(tel.metrics_url.rsplit(":", 1)[1].split("/")[0])
    pid = os.fork()  # a worker that outlives the trainer's endpoint
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    try:
        tel.shutdown()
        with socket.create_server(("127.0.0.1", port)):  # a restarted trainer's bind
            pass
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    """
)


def run(script: str, path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.slow
def test_fork_after_init_neither_deadlocks_nor_duplicates(tmp_path):
    path = tmp_path / "fork.jsonl"
    run(FORK, path)
    steps = sorted(s["attrs"]["rl.step"] for s in file_spans(path) if s["name"] == "step")
    assert steps == [1, 2]  # each parent step once; nothing from the child


@pytest.mark.slow
def test_forked_child_does_not_keep_the_metrics_port(tmp_path):
    """The child closes its copy of the listening socket: a lingering worker must not
    hold the port the next run binds (nor queue scrapes nobody answers)."""
    run(PORT_AFTER_FORK, tmp_path)


@pytest.mark.slow
def test_exit_mid_step_exports_what_closed_marked_incomplete(tmp_path):
    path = tmp_path / "crash.jsonl"
    run(CRASH, path)
    spans = file_spans(path, run="crash")
    roots = {s["attrs"]["rl.step"]: s for s in spans if s["name"] == "step"}
    assert sorted(roots) == [1, 2]
    assert "rl.incomplete" not in roots[1]["attrs"]
    incomplete = roots[2]
    assert incomplete["attrs"]["rl.incomplete"] is True and incomplete["status"] == 2
    children = {s["name"]: s for s in spans if s["parent"] == incomplete["id"]}
    assert children["gen"]["status"] == 0  # closed normally before the exit
    assert children["update_actor"]["status"] == 2  # still open: closed at exit, as an error


SIGTERM = textwrap.dedent(
    """
    import sys, time
    import rlotel
    tel = rlotel.init(run="term", prometheus_port=None, traces_file=sys.argv[1])
    for number in (1, 2):
        with tel.step(number), tel.phase("gen"):
            pass
    step = tel.step(3)
    step.__enter__()
    print("ready", flush=True)
    while True:  # a scheduler stops the job here (a sleep, not signal.pause(), which a
        time.sleep(0.05)  # signal landing just before it would leave parked for good)
    """
)


@pytest.mark.slow
def test_sigterm_flushes_then_terminates(tmp_path):
    import signal

    path = tmp_path / "term.jsonl"
    process = subprocess.Popen(
        [sys.executable, "-c", SIGTERM, str(path)], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout.readline().strip() == "ready"
    process.send_signal(signal.SIGTERM)
    assert process.wait(30) == -signal.SIGTERM  # still dies of SIGTERM, as it would have
    roots = {s["attrs"]["rl.step"]: s for s in file_spans(path) if s["name"] == "step"}
    assert sorted(roots) == [1, 2, 3]
    assert roots[3]["attrs"]["rl.incomplete"] is True


@contextlib.contextmanager
def listening(count: int) -> Iterator[int]:
    """`count` consecutive loopback ports held by listeners (as other ranks would); the first."""
    for _ in range(50):
        held: list[socket.socket] = []
        first = socket.create_server(("127.0.0.1", 0))
        held.append(first)
        base = first.getsockname()[1]
        try:
            for offset in range(1, count):
                held.append(socket.create_server(("127.0.0.1", base + offset)))
        except OSError:  # a neighbour is taken already: another base
            for sock in held:
                sock.close()
            continue
        try:
            yield base
        finally:
            for sock in held:
                sock.close()
        return
    pytest.skip("no run of free consecutive loopback ports")


def test_busy_port_falls_back_to_the_next_when_configured(caplog):
    with listening(2) as base:
        with pytest.raises(rlotel.ConfigError, match=f":{base}: Address already in use"):
            rlotel.init(run="ranks", prometheus_port=base)
        with pytest.raises(rlotel.ConfigError, match=f":{base}–{base + 1}: Address already"):
            rlotel.init(run="ranks", prometheus_port=base, prometheus_port_retries=1)
        with caplog.at_level(logging.WARNING, logger="rlotel"):
            tel = rlotel.init(run="ranks", prometheus_port=base, prometheus_port_retries=8)
        try:
            port = int(tel.metrics_url.rsplit(":", 1)[1].split("/")[0])
            assert base + 2 <= port <= base + 8
            assert f"port {base} is in use; serving /metrics on {port}" in caplog.text
            tel.log({"rank/value": 3.0}, step=1)
            assert tel.flush(10)
            assert 'rlotel_train_metric{key="rank/value",run="ranks"} 3.0' in scrape(
                tel.metrics_url
            )
        finally:
            tel.shutdown()
