"""Ray: every worker process runs rlotel, and Prometheus finds each one by file discovery.

    ray.init(runtime_env={"worker_process_setup_hook": "rlotel.integrations.ray.setup_worker"})

The hook initialises rlotel in each worker process. Traces go over OTLP (the standard
`OTEL_EXPORTER_OTLP_*` variables in the runtime env); the driver's
`tel.current_context()` travels with the actor call and the worker opens
`tel.phase(name, context=carrier)` / `record_samples(..., context=carrier)`, so worker
spans are children of the driver's phase.

Metrics: each worker serves `/metrics` on its own ephemeral port and registers it in a
Prometheus file-service-discovery JSON (one file per process, like Ray's own
`prom_metrics_service_discovery.json`; Prometheus reads `files: [<dir>/rlotel-*.json]`). Chosen
over OTLP metrics because a scrape keeps OpenMetrics exemplars (p99 → trace) and the
exact catalogue series the dashboards query. `rank`, `role` and `node` are target labels
from the discovery file, so they reach every series with cardinality bounded by the
number of workers, not by anything the workload does.

Across nodes each node's directory holds only its own workers, so every process also
publishes its target in Ray's GCS key-value store (namespace `rlotel`, one key per
process under its job) and refreshes it each second. The driver (`serve_targets`) reads
them and serves Prometheus HTTP service discovery at `/targets` on its own `/metrics`
listener (and, if asked, one file-SD JSON of them all): a target whose heartbeat stopped
for `TARGET_TTL_S` (a killed actor, a dead node) is left out. The advertised address is
the bind address, or Ray's node address when bound to all interfaces — never `0.0.0.0`.

The same heartbeat carries the process's progress under other processes' spans (its stall
watch's `reported`: remote parent span → latest progress, a few dozen at most): the driver
compares each process's entries with the last it read and hands the spans that moved to
its own stall watch (`StallWatch.heard`), so its `gen` knows whether the trajectories and
reward calls it waits on still complete. Nothing is sent to the driver from the worker's
call path; a slow or absent GCS costs the heartbeat thread only.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import logging
import os
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import rlotel
from rlotel.base import env
from rlotel.integrations import service
from rlotel.schema import attributes as attr

log = logging.getLogger("rlotel")

KV_NAMESPACE = "rlotel"
HEARTBEAT_S = 1.0  # each process refreshes its target this often
TARGET_TTL_S = 3.0  # a target whose heartbeat stopped this long is gone (killed, node died)
POLL_S = 0.5  # the driver reads the targets this often
POLL_SHARE = 0.01  # of a core, the most the driver's polls of the targets take
FORGET_S = 60.0  # a dead target's key is deleted after this long
PROGRESS_KEY = "progress"  # in a heartbeat: remote parent span (hex) → latest progress there
MAX_PROGRESS = 64  # entries read from one process's heartbeat; more are dropped (counted)
UNSPECIFIED_HOSTS = ("", "0.0.0.0", "::", "[::]")


def discovery_dir() -> Path:
    """Where worker endpoints are registered (`RLOTEL_PROMETHEUS_SD_DIR`, by default next
    to Ray's own discovery file)."""
    return env.Environment.read().prometheus_sd_dir


def setup_worker() -> None:
    """`worker_process_setup_hook`: telemetry for this worker process, registered for
    scraping. Never raises: a worker must start even if telemetry cannot."""
    from rlotel.integrations import startup

    try:
        import ray

        environment = env.Environment.read()
        identity = {
            attr.ROLE: environment.role or "worker",
            attr.RANK: environment.rank,
            attr.NODE: ray.util.get_node_ip_address(),
        }
        tel = rlotel.current() or startup.start(
            environment=environment,
            run=environment.run or "ray",
            service_name=environment.service_name or "rlotel-ray-worker",
            prometheus_addr=environment.metrics_addr,
            prometheus_port=0,
            resource_attributes=identity,  # role and rank also label its per-rank series
        )
        labels = {key.removeprefix(attr.NAMESPACE): str(value) for key, value in identity.items()}
        register(tel.metrics_url, labels)
    except Exception as error:
        log.warning("rlotel: Ray worker telemetry off: %r", error)


def register(metrics_url: str | None, labels: dict[str, str]) -> Path | None:
    """Write this process's target to the discovery directory (`write_target`) and, in a
    Ray process, publish it in the cluster's key-value store (kept alive by a heartbeat)."""
    try:
        path = write_target(metrics_url, labels)
    except OSError as error:  # discovery is never worth failing a worker for
        log.warning("rlotel: target not written for file discovery: %r", error)
        return None
    if path is None:
        return None
    try:
        publish(metrics_url, labels)
    except Exception as error:
        log.warning("rlotel: target not published to the Ray cluster: %r", error)
    return path


def write_target(
    metrics_url: str | None, labels: dict[str, str], kind: str = "rlotel"
) -> Path | None:
    """This process's target as a Prometheus file-discovery JSON in `discovery_dir()`,
    removed at exit (`target_path`); the file, or None without an endpoint. `kind` names
    the job that scrapes it: `rlotel` for rlotel's own processes, `transfer-queue` for the
    TransferQueue endpoint this process found (`verl_v1.register_transfer_queue`)."""
    if not metrics_url:
        return None
    target = advertised_target(metrics_url)
    path = target_path(kind)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps([{"targets": [target], "labels": labels}]))
    temporary.replace(path)  # atomic: Prometheus never reads half a file
    atexit.register(path.unlink, missing_ok=True)
    return path


def target_path(kind: str) -> Path:
    """This process's discovery file of `kind` (the shipped jobs read `<kind>-*.json`)."""
    return discovery_dir() / f"{kind}-{os.getpid()}.json"


def advertised_target(metrics_url: str) -> str:
    """`host:port` others can reach: the bind address, or Ray's node address (this node's
    address in the cluster) when the endpoint listens on all interfaces."""
    parts = urllib.parse.urlsplit(metrics_url)
    host = parts.hostname or ""
    if host in UNSPECIFIED_HOSTS:
        host = _node_ip()
    host = f"[{host}]" if ":" in host else host
    return f"{host}:{parts.port}"


def _node_ip() -> str:
    ray = _ray()
    if ray is not None:
        try:
            return ray.util.get_node_ip_address()
        except Exception:
            pass
    import socket

    return socket.gethostbyname(socket.gethostname())


def _ray() -> Any:
    """The `ray` module when this process is connected to a cluster, else None."""
    import sys

    ray = sys.modules.get("ray")
    return ray if ray is not None and ray.is_initialized() else None


# --- the cluster's targets: published by each process, served by the driver --------------


_heartbeat: _Heartbeat | None = None  # this process's (one per process)


def _kv() -> Any:
    from ray.experimental import internal_kv

    return internal_kv


def _job_prefix(ray: Any) -> str:
    return f"targets/{ray.get_runtime_context().get_job_id()}/"


def publish(metrics_url: str, labels: dict[str, str]) -> str | None:
    """This process's target in Ray's GCS key-value store, refreshed every `HEARTBEAT_S` on
    a daemon thread and deleted at exit; the key, or None outside Ray."""
    global _heartbeat
    ray = _ray()
    if ray is None or _heartbeat is not None:
        return None
    context = ray.get_runtime_context()
    node_id = context.get_node_id()
    key = f"{_job_prefix(ray)}{node_id}/{os.getpid()}"
    entry_labels = {**labels, attr.NODE_ID.removeprefix(attr.NAMESPACE): node_id}
    entry_labels.setdefault("node", _node_ip())
    if urllib.parse.urlsplit(metrics_url).scheme == "https":
        entry_labels["__scheme__"] = "https"
    _heartbeat = _Heartbeat(key, advertised_target(metrics_url), entry_labels)
    _heartbeat.beat()  # published before the first scrape could look for it
    _heartbeat.start()
    atexit.register(_heartbeat.stop)
    return key


class _Heartbeat:
    def __init__(self, key: str, target: str, labels: dict[str, str]) -> None:
        self.key, self.target, self.labels = key, target, labels
        self.count = 0
        self._stop = threading.Event()

    def beat(self) -> None:
        self.count += 1
        value = {"targets": [self.target], "labels": self.labels, "beat": self.count}
        progress = _progress()
        if progress:
            value[PROGRESS_KEY] = progress
        _kv()._internal_kv_put(self.key, json.dumps(value), True, namespace=KV_NAMESPACE)

    def start(self) -> None:
        threading.Thread(target=self._run, name="rlotel-targets", daemon=True).start()

    def _run(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                self.beat()
            except Exception:  # the cluster is going away: the driver ages us out
                if _ray() is None:
                    return

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(Exception):  # the cluster went first
            _kv()._internal_kv_del(self.key, namespace=KV_NAMESPACE)


def _progress() -> dict[str, int]:
    """This process's progress under other processes' spans (its stall watch's report)."""
    try:
        tel = rlotel.current()
        return service.of(tel).progress_reported() if tel is not None else {}
    except Exception:  # a telemetry shutting down: nothing to report
        return {}


class TargetDirectory:
    """The driver's view of every process's target in its Ray job: polled from the GCS
    every `poll_s` (longer where polls would take over POLL_SHARE of a core), a target
    left out once its heartbeat has not moved for `ttl_s` (on the driver's monotonic
    clock, so no two clocks are compared)."""

    def __init__(
        self,
        own: dict[str, Any] | None = None,
        file_sd: Path | None = None,
        ttl_s: float = TARGET_TTL_S,
        poll_s: float = POLL_S,
        on_progress: Callable[[list[int]], None] | None = None,
    ) -> None:
        ray = _ray()
        if ray is None:
            raise RuntimeError("serve_targets needs a connected Ray driver (ray.init first)")
        self._prefix = _job_prefix(ray)
        self._own = own
        self._file_sd = file_sd
        self.ttl_s, self.poll_s = ttl_s, poll_s
        self.interval_s = poll_s  # between polls: poll_s, longer when a poll is costly
        self.polled_cpu_s = 0.0  # the poll thread's CPU in polls so far
        self._seen: dict[str, tuple[int, float, dict[str, Any]]] = {}  # key → beat, when, entry
        self._lock = threading.Lock()
        self._live: list[dict[str, Any]] = [own] if own else []
        self._written: str | None = None
        self._stop = threading.Event()
        self.url: str | None = None  # where /targets is served (the driver's listener)
        self.on_progress = on_progress  # spans other processes showed progress under
        self._progress: dict[str, dict[str, Any]] = {}  # key → its last progress entries
        self.progress_dropped = 0  # entries past MAX_PROGRESS or malformed
        self.poll()
        self._thread = threading.Thread(target=self._run, name="rlotel-targets", daemon=True)
        self._thread.start()

    def targets(self) -> list[dict[str, Any]]:
        """Prometheus HTTP-SD / file-SD groups, one per live process."""
        with self._lock:
            return list(self._live)

    def body(self) -> tuple[str, bytes]:
        return "application/json", json.dumps(self.targets()).encode()

    def poll(self) -> None:
        kv = _kv()
        keys = kv._internal_kv_list(self._prefix, namespace=KV_NAMESPACE)
        values = _multi_get(kv, keys)
        now = time.monotonic()
        live: list[dict[str, Any]] = []
        seen: dict[str, tuple[int, float, dict[str, Any]]] = {}
        moved: list[int] = []
        progress: dict[str, dict[str, Any]] = {}
        for raw_key, raw in values.items():
            key = raw_key.decode() if isinstance(raw_key, bytes) else raw_key
            try:
                entry = json.loads(raw)
                beat = int(entry.pop("beat"))
            except (TypeError, ValueError, KeyError, AttributeError):
                continue
            entries = entry.pop(PROGRESS_KEY, None)
            if isinstance(entries, dict):
                progress[key] = entries
                moved += self._moved(self._progress.get(key, {}), entries)
            last = self._seen.get(key)
            changed = last is None or last[0] != beat
            when = now if changed else last[1]
            seen[key] = (beat, when, entry)
            if now - when <= self.ttl_s:
                live.append(entry)
            elif now - when > FORGET_S:
                kv._internal_kv_del(key, namespace=KV_NAMESPACE)
        live.sort(key=lambda e: (e["labels"].get("role", ""), e["labels"].get("rank", "")))
        if self._own:
            live.insert(0, self._own)  # the driver first, then by role and rank
        with self._lock:
            self._seen, self._live = seen, live
        self._progress = progress
        if moved and self.on_progress is not None:
            self.on_progress(moved)
        self._write_file(live)

    def _moved(self, before: dict[str, Any], now: dict[str, Any]) -> list[int]:
        """The spans whose progress entry changed since the last read (first seen: moved)."""
        moved = []
        for index, (span, at) in enumerate(now.items()):
            if index >= MAX_PROGRESS:
                self.progress_dropped += len(now) - MAX_PROGRESS
                break
            if before.get(span) == at:
                continue
            try:
                moved.append(int(span, 16))
            except (TypeError, ValueError):
                self.progress_dropped += 1
        return moved

    def _write_file(self, live: list[dict[str, Any]]) -> None:
        if self._file_sd is None:
            return
        text = json.dumps(live)
        if text == self._written:
            return
        self._file_sd.parent.mkdir(parents=True, exist_ok=True)
        temporary = self._file_sd.with_suffix(".tmp")
        temporary.write_text(text)
        temporary.replace(self._file_sd)  # atomic
        self._written = text

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            started = time.thread_time()
            try:
                self.poll()
            except Exception as error:  # the GCS is away (shutdown, head node lost)
                if _ray() is None:
                    return
                log.debug("rlotel: cluster targets not read: %r", error)
            # Thousands of processes make a poll cost milliseconds: wait long enough that
            # polling never takes more than POLL_SHARE of a core.
            spent = time.thread_time() - started
            self.polled_cpu_s += spent
            self.interval_s = max(self.poll_s, spent / POLL_SHARE)

    def close(self) -> None:
        self._stop.set()


def _multi_get(kv: Any, keys: list[bytes]) -> dict[bytes, bytes]:
    if not keys:
        return {}
    client = kv.internal_kv_get_gcs_client()
    multi_get = getattr(client, "internal_kv_multi_get", None)
    if multi_get is not None:
        try:
            return dict(multi_get(keys, KV_NAMESPACE.encode()))
        except Exception:
            pass
    found = {key: kv._internal_kv_get(key, namespace=KV_NAMESPACE) for key in keys}
    return {key: value for key, value in found.items() if value is not None}


def _heard(tel: Any, span_ids: list[int]) -> None:
    """Progress other processes showed under these spans, to this process's stall watch."""
    dropped = service.of(tel).heard_progress(span_ids)
    if dropped:
        service.of(tel).dropped(
            "spans", "remote_progress_dropped", f"{dropped} span(s) of remote progress", dropped
        )


def serve_targets(tel: Any, file_sd: Path | None = None, **options: Any) -> TargetDirectory:
    """In the Ray driver: every rlotel process of this job, the driver's own `/metrics`
    included, as Prometheus HTTP service discovery at `<driver's /metrics host:port>/targets`
    (`http_sd_configs: [{url: ...}]`), and as one file-SD JSON at `file_sd` if given.
    Stops with `tel.shutdown()`."""
    own = None
    if tel.metrics_url:
        resource = service.of(tel).resource
        labels = {
            "role": str(resource.get(attr.ROLE) or "driver"),
            "rank": str(resource.get(attr.RANK, 0)),
            "node": _node_ip(),
            attr.NODE_ID.removeprefix(attr.NAMESPACE): _ray().get_runtime_context().get_node_id(),
        }
        if urllib.parse.urlsplit(tel.metrics_url).scheme == "https":
            labels["__scheme__"] = "https"
        own = {"targets": [advertised_target(tel.metrics_url)], "labels": labels}
    options.setdefault("on_progress", functools.partial(_heard, tel))
    directory = TargetDirectory(own, file_sd, **options)
    directory.url = tel.serve_path("/targets", directory.body)
    tel.on_shutdown(directory.close)
    return directory
