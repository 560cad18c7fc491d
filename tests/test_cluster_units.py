"""Multi-node pieces that need no cluster: the NTP-style offset, clock alignment in the
readers, the advertised address, the test clock hook, the target directory's ageing, the
driver's /targets route. The cluster itself: tests/test_ray_cluster.py."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request

import pytest

from rlotel.base import clock, env
from rlotel.integrations import ray as ray_integration
from rlotel.integrations.clock_exchange import CLOCK_KEY, ClockExchange
from rlotel.offline import otlp_json
from rlotel.offline.otlp_json import SpanRecord

S = 1_000_000_000


@pytest.mark.parametrize(
    ("forward_ns", "back_ns"), [(100_000, 100_000), (50_000, 3_000_000), (4_000_000, 10)]
)
def test_the_true_offset_lies_within_the_uncertainty_whatever_the_legs(forward_ns, back_ns):
    true_offset = 2 * S + 12_345  # the worker's clock minus the driver's
    t1 = 1_000 * S  # driver sends
    t2 = t1 + forward_ns + true_offset  # worker receives (its clock)
    t3 = t2 + 300_000_000  # worker replies after 0.3 s of work
    t4 = t3 - true_offset + back_ns  # driver receives the reply
    offset, uncertainty = clock.ntp_offset(t1, t2, t3, t4)
    assert abs(offset - true_offset) <= uncertainty
    assert uncertainty == pytest.approx((forward_ns + back_ns) / 2, abs=1)  # not the work


class Ref:
    """A stand-in for a Ray `ObjectRef`: what the exchange reads of one (its id)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def binary(self) -> bytes:
        return self.name.encode()


def test_the_exchange_over_two_carriers_sets_the_offset(monkeypatch):
    monkeypatch.setattr(clock, "_offset", [])
    worker = ClockExchange(lambda: False)
    worker.heard("1000", 1500, 2500)  # first call: t1; received/replied t2, t3
    assert clock.offset() is None  # one leg says nothing yet
    worker.heard("999,2100", 3000, 3100)  # another t1: not this exchange's t4
    assert clock.offset() is None
    worker.heard("1000,2100", 3000, 3100)
    assert clock.offset() == clock.ntp_offset(1000, 1500, 2500, 2100) == (450, 50)
    worker.heard("garbage", 1, 2)  # never raises
    assert clock.offset() == (450, 50)


def test_the_driver_stamps_each_actor_twice_then_never():
    driver = ClockExchange(lambda: True)
    carrier = {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}
    first, note = driver.stamp("actor", carrier)
    t1 = int(first[CLOCK_KEY])
    assert note and CLOCK_KEY not in carrier  # the shared carrier is untouched
    driver.sent(Ref("first"), "actor")
    assert driver.awaiting and driver.stamp("actor", carrier) == (carrier, False)  # pending
    driver.replied([Ref("first")])  # the reply is timed: t4
    assert not driver.awaiting
    second, note = driver.stamp("actor", carrier)
    sent, replied = map(int, second[CLOCK_KEY].split(","))
    assert sent == t1 <= replied <= clock.unix_ns() and not note
    assert "actor" in driver.done  # from now on: the shared carrier, one lookup
    worker = ClockExchange(lambda: False)
    assert worker.stamp("other", carrier) == (carrier, False)  # not the driver
    assert "other" in worker.done
    worker.declare_reference()  # the process that runs the trainer loop, inside an actor
    assert CLOCK_KEY in worker.stamp("third", carrier)[0]


def test_the_per_process_offset_measurement_costs_well_under_a_millisecond(monkeypatch):
    monkeypatch.setattr(clock, "_offset", [])
    driver, worker = ClockExchange(lambda: True), ClockExchange(lambda: False)
    carrier = {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}
    started = time.perf_counter()
    first, _ = driver.stamp("a", carrier)
    driver.sent(Ref("a"), "a")
    worker.heard(first[CLOCK_KEY], clock.unix_ns(), clock.unix_ns())
    driver.replied([Ref("a")])
    second, _ = driver.stamp("a", carrier)
    worker.heard(second[CLOCK_KEY], clock.unix_ns(), clock.unix_ns())
    spent = time.perf_counter() - started
    assert clock.offset() is not None
    assert spent < 1e-3


def test_the_test_clock_hook_shifts_rlotels_unix_clock_only_when_set():
    assert env.test_clock_shift_ns({}) == 0
    assert env.test_clock_shift_ns({"RLOTEL_TEST_CLOCK_SHIFT_S": "2"}) == 2 * S
    assert env.test_clock_shift_ns({"RLOTEL_TEST_CLOCK_SHIFT_S": "x"}) == 0
    code = "import time; from rlotel.base import clock; print(clock.unix_ns() - time.time_ns())"
    shifted = subprocess.run(
        [sys.executable, "-c", code],
        env={**__import__("os").environ, "RLOTEL_TEST_CLOCK_SHIFT_S": "2"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert abs(int(shifted.stdout) - 2 * S) < 0.1 * S
    assert abs(clock.unix_ns() - time.time_ns()) < 0.1 * S  # this process: unshifted


def span(span_id, parent, start, end, pid, **attributes) -> SpanRecord:
    resource = {"service.name": "rlotel", "service.instance.id": str(pid), "process.pid": pid}
    return SpanRecord("t" * 32, span_id, parent, span_id, start, end, attributes, resource)


def test_readers_shift_each_process_by_its_offset_and_keep_causality():
    driver = span("d", "", 10 * S, 11 * S, 1)
    worker_root = span("w", "d", 12 * S + 100, 12 * S + 500_000_000, 2)  # 2 s ahead
    worker_later = span(
        "x",
        "",
        20 * S,
        21 * S,
        2,
        **{"rl.clock.offset_ns": 2 * S + 200, "rl.clock.uncertainty_ns": 1000},
    )
    other = span("o", "", 5 * S, 6 * S, 3)  # no offset: unchanged
    aligned = {
        s.span_id: s for s in otlp_json.align_clocks([driver, worker_root, worker_later, other])
    }
    # the measured 2 s + 200 ns would put the child 100 ns before its parent: lowered by
    # 100 ns (within the 1000 ns uncertainty), so it starts exactly with it
    assert aligned["w"].start_ns == driver.start_ns
    assert aligned["x"].start_ns == 20 * S - (2 * S + 100)  # every span of the process
    assert aligned["d"] == driver and aligned["o"] == other
    # never beyond the uncertainty, whatever the spans claim
    far = span(
        "w",
        "d",
        9 * S,
        9 * S + 1,
        2,
        **{"rl.clock.offset_ns": 2 * S, "rl.clock.uncertainty_ns": 10},
    )
    (moved,) = [s for s in otlp_json.align_clocks([driver, far]) if s.span_id == "w"]
    assert moved.start_ns == 9 * S - (2 * S - 10)


@pytest.mark.parametrize(
    ("url", "target"),
    [
        ("http://0.0.0.0:9464/metrics", "10.1.2.3:9464"),
        ("http://[::]:9464/metrics", "10.1.2.3:9464"),
        ("http://127.0.0.1:9464/metrics", "127.0.0.1:9464"),
        ("https://10.9.9.9:1234/metrics", "10.9.9.9:1234"),
    ],
)
def test_the_advertised_target_is_never_the_unspecified_address(monkeypatch, url, target):
    monkeypatch.setattr(ray_integration, "_node_ip", lambda: "10.1.2.3")
    assert ray_integration.advertised_target(url) == target


class FakeKv:
    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}

    def _internal_kv_put(self, key, value, overwrite=True, namespace=None):
        self.data[key.encode()] = value.encode()

    def _internal_kv_list(self, prefix, namespace=None):
        return [key for key in self.data if key.startswith(prefix.encode())]

    def _internal_kv_get(self, key, namespace=None):
        return self.data.get(key)

    def _internal_kv_del(self, key, namespace=None):
        self.data.pop(key.encode() if isinstance(key, str) else key, None)

    def internal_kv_get_gcs_client(self):
        return None


class FakeRay:
    class _Context:
        def get_job_id(self):
            return "01000000"

    def get_runtime_context(self):
        return self._Context()


def test_a_target_whose_heartbeat_stops_leaves_within_the_ttl(monkeypatch, tmp_path):
    kv = FakeKv()
    monkeypatch.setattr(ray_integration, "_kv", lambda: kv)
    monkeypatch.setattr(ray_integration, "_ray", lambda: FakeRay())
    alive = ray_integration._Heartbeat("targets/01000000/n1/11", "10.0.0.1:1", {"rank": "0"})
    dying = ray_integration._Heartbeat("targets/01000000/n2/22", "10.0.0.2:2", {"rank": "1"})
    elsewhere = ray_integration._Heartbeat("targets/02000000/n3/33", "10.0.0.3:3", {"rank": "0"})
    for heartbeat in (alive, dying, elsewhere):
        heartbeat.beat()
    own = {"targets": ["127.0.0.1:9464"], "labels": {"role": "driver", "rank": "0"}}
    file_sd = tmp_path / "sd.json"
    directory = ray_integration.TargetDirectory(own, file_sd, ttl_s=0.3, poll_s=3600)
    try:
        assert [t["targets"] for t in directory.targets()] == [
            ["127.0.0.1:9464"],
            ["10.0.0.1:1"],
            ["10.0.0.2:2"],
        ]  # the job's own only
        deadline = time.monotonic() + 0.6
        while time.monotonic() < deadline:  # only one keeps beating
            alive.beat()
            directory.poll()
            time.sleep(0.05)
        assert [t["targets"] for t in directory.targets()] == [["127.0.0.1:9464"], ["10.0.0.1:1"]]
        assert json.loads(file_sd.read_text()) == directory.targets()
        assert json.loads(directory.body()[1]) == directory.targets()
        alive.stop()  # a clean exit deletes the key at once
        directory.poll()
        assert [t["targets"] for t in directory.targets()] == [["127.0.0.1:9464"]]
    finally:
        directory.close()


TARGETS = 2000  # a poll of them costs milliseconds: the thread waits ~100x that between polls


def test_polling_thousands_of_targets_takes_at_most_its_share_of_a_core(monkeypatch):
    """At a thousand processes a poll costs milliseconds: the thread waits long enough
    between polls that they take at most POLL_SHARE of a core (their own CPU clock)."""
    kv = FakeKv()
    monkeypatch.setattr(ray_integration, "_kv", lambda: kv)
    monkeypatch.setattr(ray_integration, "_ray", lambda: FakeRay())
    for pid in range(TARGETS):
        labels = {"role": "actor", "rank": str(pid)}
        ray_integration._Heartbeat(f"targets/01000000/n/{pid}", f"10.0.0.1:{pid}", labels).beat()
    directory = ray_integration.TargetDirectory(poll_s=0.001, ttl_s=3600)  # a poll a millisecond
    try:

        def after_the_next_poll(cpu: float) -> float:
            """The thread's poll CPU once it has polled again (bounded wait)."""
            deadline = time.perf_counter() + 30
            while directory.polled_cpu_s == cpu and time.perf_counter() < deadline:
                time.sleep(0.005)
            return directory.polled_cpu_s

        # Each poll's wait follows it and pays for it: over the waits after two polls and
        # the poll after each wait, the share is those two polls' CPU over that wall time.
        # (A window ending on a poll would leave out the wait that pays for it: a poll a
        # collection made dearer read as ten times the share in CI on 61661ff.)
        first = after_the_next_poll(0.0)  # the thread's first poll: all its CPU so far
        started = time.perf_counter()
        paid = after_the_next_poll(first)  # the first two polls, whose waits come next
        after_the_next_poll(paid)
        share = paid / (time.perf_counter() - started)  # a poll every 1 ms: ~all of a core
        assert len(directory.targets()) == TARGETS
        assert directory.interval_s > 100 * directory.poll_s
        assert 0 < share <= 1.5 * ray_integration.POLL_SHARE, share
    finally:
        directory.close()


def test_the_driver_serves_targets_next_to_metrics_behind_its_credentials(make_tel):
    tel = make_tel(prometheus_basic_auth=("u", "p"))
    url = tel.serve_path("/targets", lambda: ("application/json", b'[{"targets": ["a:1"]}]'))
    assert url == tel.metrics_url.replace("/metrics", "/targets")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url, timeout=5)
    assert refused.value.code == 401
    request = urllib.request.Request(url, headers={"Authorization": "Basic dTpw"})
    with urllib.request.urlopen(request, timeout=5) as response:
        assert json.load(response) == [{"targets": ["a:1"]}]
    assert make_tel(prometheus_port=None).serve_path("/targets", lambda: ("", b"")) is None
