"""The observability stack's configs (docker-compose.yml, collector/) hold together.

No container runs here: each test checks what local tools and parsing can prove. The stack
`rlotel stack DIR` writes is the same: its docker-compose.yml is the repository's, byte for
byte, and every path it mounts, and every file its services' configs name, resolves inside
DIR (`docker compose config` cannot run here: no Docker Compose).
"""

from __future__ import annotations

import copy
import fnmatch
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from rlotel.cli import commands as cli
from rlotel.offline.stack import write_stack

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
COLLECTOR = ROOT / "collector"  # `rlotel stack DIR`
OTELCOL = COLLECTOR / "otelcol.yaml"
DATASOURCES = COLLECTOR / "grafana" / "provisioning" / "datasources" / "datasources.yaml"

# Hosts a container reaches that are not compose services.
NON_SERVICE_HOSTS = {"localhost", "host.docker.internal"}
# Pre-0.144 exporter names, now deprecated aliases of otlp_grpc / otlp_http.
DEPRECATED_EXPORTERS = {"otlp", "otlphttp"}
DURATION = re.compile(r"^(\d+(?:\.\d+)?)(us|µs|ms|s|m|h)$")
UNIT_SECONDS = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def tool(name: str) -> str | None:
    """`name` on PATH, else next to this interpreter (the venv's bin/)."""
    found = shutil.which(name)
    if found:
        return found
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else None


def run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120)


def services() -> dict[str, dict[str, Any]]:
    return load(COMPOSE)["services"]


def bind_sources(service: dict[str, Any]) -> list[str]:
    """Host paths of a service's bind mounts (short `src:dst[:mode]` or long syntax)."""
    sources = []
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
            if volume.get("type") == "bind":
                sources.append(volume["source"])
            continue
        source = volume.split(":", 1)[0]
        if source.startswith((".", "/", "~")):  # otherwise a named volume
            sources.append(source)
    return sources


def image_tag(image: str) -> str | None:
    """The tag of `repo[:port]/name:tag`, or None when there is none."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return last.rsplit(":", 1)[1] if ":" in last else None


def component_type(component_id: str) -> str:
    return component_id.split("/", 1)[0]


def collector_errors(config: dict[str, Any]) -> list[str]:
    """What the collector would reject: pipelines naming undefined components, and connectors
    not used both as an exporter and as a receiver."""
    defined = {kind: set(config.get(kind) or {}) for kind in ("receivers", "processors")}
    exporters, connectors = set(config.get("exporters") or {}), set(config.get("connectors") or {})
    defined["receivers"] |= connectors
    defined["exporters"] = exporters | connectors
    errors = []
    used_as: dict[str, set[str]] = {"receivers": set(), "exporters": set()}
    pipelines = (config.get("service") or {}).get("pipelines") or {}
    if not pipelines:
        errors.append("no pipelines")
    for pipeline_id, pipeline in pipelines.items():
        for kind in ("receivers", "processors", "exporters"):
            for name in pipeline.get(kind) or []:
                if name not in defined[kind]:
                    errors.append(f"pipeline {pipeline_id}: {kind[:-1]} {name} is not defined")
                if kind in used_as:
                    used_as[kind].add(name)
    for connector in sorted(connectors):
        for kind in ("exporters", "receivers"):
            if connector not in used_as[kind]:
                errors.append(f"connector {connector} is never used as a {kind[:-1]}")
    return errors


def seconds(duration: str | int | float) -> float:
    """A collector duration (`250ms`, `2.5s`, `1h`) in seconds."""
    match = DURATION.match(str(duration))
    assert match, f"not a duration: {duration!r}"
    return float(match.group(1)) * UNIT_SECONDS[match.group(2)]


def host_port(address: str) -> tuple[str, int]:
    parsed = urlsplit(address if "://" in address else f"//{address}")
    assert parsed.hostname and parsed.port, f"no host:port in {address!r}"
    return parsed.hostname, parsed.port


@pytest.mark.slow
def test_compose_file_matches_the_compose_spec():
    checker = tool("check-jsonschema")
    assert checker, "check-jsonschema is not installed in the venv"
    result = run([checker, "--builtin-schema", "vendor.compose-spec", str(COMPOSE)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_bind_mount_source_exists():
    missing = [
        f"{name}: {source}"
        for name, service in services().items()
        for source in bind_sources(service)
        if not (ROOT / source).expanduser().exists()
    ]
    assert not missing, f"bind-mounted paths absent from the repository: {missing}"


def test_the_stack_is_mounted_from_the_top_level_collector_and_dashboards():
    """One source: every stack service mounts the repository's collector/ or dashboards/."""
    stack = {name: bind_sources(s) for name, s in services().items() if name != "demo"}
    assert all(stack.values()), stack
    outside = [
        f"{name}: {source}"
        for name, sources in stack.items()
        for source in sources
        if Path(source).parts[0] not in ("collector", "dashboards")
    ]
    assert not outside, outside
    assert "./dashboards" in stack["grafana"] and "./collector" in stack["prometheus"]


def test_the_demo_service_installs_this_release_from_the_index_not_a_source_tree():
    """The demo mounts nothing (a stack directory has no source tree): it pip-installs
    `rlotel[<extra>]==<this version>`, an extra pyproject.toml declares, unless
    RLOTEL_REQUIREMENT names another requirement."""
    demo = services()["demo"]
    assert "volumes" not in demo and "working_dir" not in demo
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    default = re.fullmatch(
        r"\$\{RLOTEL_REQUIREMENT:-rlotel\[(\w+)\]==(.+)\}",
        demo["environment"]["RLOTEL_REQUIREMENT"],
    )
    assert default, demo["environment"]["RLOTEL_REQUIREMENT"]
    extra, version = default.groups()
    assert version == project["version"], "docker-compose.yml pins another rlotel release"
    assert extra in project["optional-dependencies"]
    script = demo["command"][-1]
    assert 'pip install --no-cache-dir "$$RLOTEL_REQUIREMENT"' in script
    # the command line the container runs is one this rlotel's CLI takes
    args = cli.parser().parse_args(shlex.split(script.split("exec rlotel ", 1)[1]))
    assert (args.command, args.addr, args.port) == ("demo", "0.0.0.0", 9464)
    assert "9464:9464" in demo["ports"]


def test_every_image_is_pinned():
    for name, service in services().items():
        tag = image_tag(service["image"])
        assert tag and tag != "latest", f"{name}: image {service['image']!r} is not pinned"


def test_image_tag_parsing_handles_registry_ports():
    assert image_tag("localhost:5000/prom/prometheus") is None
    assert image_tag("localhost:5000/prom/prometheus:v2.54.1") == "v2.54.1"


def test_collector_pipelines_reference_defined_components():
    config = load(OTELCOL)
    assert collector_errors(config) == []
    assert config["connectors"], "the spanmetrics connector is what makes metrics from spans"


def test_collector_checker_rejects_an_undefined_exporter():
    broken = copy.deepcopy(load(OTELCOL))
    broken["service"]["pipelines"]["traces"]["exporters"].append("otlp_grpc/nowhere")
    assert collector_errors(broken) == [
        "pipeline traces: exporter otlp_grpc/nowhere is not defined"
    ]


def test_collector_checker_rejects_a_one_sided_connector():
    broken = copy.deepcopy(load(OTELCOL))
    broken["service"]["pipelines"]["metrics"]["receivers"].remove("spanmetrics")
    assert collector_errors(broken) == ["connector spanmetrics is never used as a receiver"]


def test_collector_uses_the_0_144_exporter_names():
    exporters = load(OTELCOL)["exporters"]
    deprecated = [name for name in exporters if component_type(name) in DEPRECATED_EXPORTERS]
    assert not deprecated, f"use otlp_grpc/otlp_http, not {deprecated}"


def test_spanmetrics_buckets_cover_rl_phases():
    spanmetrics = load(OTELCOL)["connectors"]["spanmetrics"]
    bounds = [seconds(b) for b in spanmetrics["histogram"]["explicit"]["buckets"]]
    assert bounds == sorted(set(bounds)), "buckets must be strictly increasing"
    assert bounds[0] <= 0.010
    assert bounds[-1] >= 3600
    assert spanmetrics["exemplars"]["enabled"] is True
    assert {d["name"] for d in spanmetrics["dimensions"]} >= {"rl.phase", "rl.run"}


@pytest.mark.slow
def test_promtool_accepts_the_prometheus_config():
    promtool = shutil.which("promtool")
    assert promtool, "promtool is not installed: `make system-deps` installs it"
    result = run([promtool, "check", "config", str(COLLECTOR / "prometheus.yml")])
    assert result.returncode == 0, result.stdout + result.stderr


def test_config_addresses_name_compose_services():
    """A typo in a hostname or port only shows once the stack runs; catch it here."""
    names = set(services())
    collector = load(OTELCOL)
    tempo_host, tempo_port = host_port(collector["exporters"]["otlp_grpc/tempo"]["endpoint"])
    tempo_grpc = load(COLLECTOR / "tempo.yaml")["distributor"]["receivers"]["otlp"]["protocols"]
    assert tempo_host in names
    assert tempo_port == host_port(tempo_grpc["grpc"]["endpoint"])[1]

    metrics_port = host_port(collector["exporters"]["prometheus"]["endpoint"])[1]
    jobs = load(COLLECTOR / "prometheus.yml")["scrape_configs"]
    targets = [
        host_port(target)
        for job in jobs
        for static in job.get("static_configs", [])
        for target in static["targets"]
    ]
    targets += [  # names found by DNS: compose services (profiles `demo`, `scale`)
        (name, sd["port"])
        for job in jobs
        for sd in job.get("dns_sd_configs", [])
        for name in sd["names"]
    ]
    assert ("otel-collector", metrics_port) in targets
    assert {host for host, _ in targets} <= names | NON_SERVICE_HOSTS

    urls = [source["url"] for source in load(DATASOURCES)["datasources"]]
    assert {host_port(url)[0] for url in urls} <= names


def test_exemplars_link_to_the_tempo_datasource():
    sources = {source["uid"]: source for source in load(DATASOURCES)["datasources"]}
    prometheus = sources["prometheus"]
    destinations = prometheus["jsonData"]["exemplarTraceIdDestinations"]
    assert destinations, "Prometheus exemplars link nowhere"
    for destination in destinations:
        target = sources.get(destination["datasourceUid"])
        assert target is not None, f"no datasource with uid {destination['datasourceUid']!r}"
        assert target["type"] == "tempo"
    assert destinations[0]["name"] == "trace_id"  # the exemplar label the collector writes


@pytest.mark.slow
def test_amtool_accepts_the_alertmanager_config():
    amtool = shutil.which("amtool")
    assert amtool, "amtool is not installed: `make system-deps` installs it"
    result = run([amtool, "check-config", str(COLLECTOR / "alertmanager.yml")])
    assert result.returncode == 0, result.stdout + result.stderr


def test_discovery_jobs_read_directories_the_stack_mounts():
    """Workers, TransferQueue and engines are found by file discovery in collector/ (mounted
    at /etc/prometheus), each job reading the files rlotel names for it; an engine target
    must carry `replica`."""
    from rlotel.integrations import ray as ray_integration
    from rlotel.integrations.verl_v1 import TRANSFER_QUEUE_JOB

    jobs = {job["job_name"]: job for job in load(COLLECTOR / "prometheus.yml")["scrape_configs"]}
    for name, pattern in (
        ("rlotel-workers", "workers/rlotel-*.json"),
        ("node-exporter", "workers/rlotel-*.json"),
        ("dcgm-exporter", "workers/rlotel-*.json"),
        (TRANSFER_QUEUE_JOB, f"workers/{TRANSFER_QUEUE_JOB}-*.json"),
        ("rollout-engines", "engines/*.json"),
    ):
        (files,) = [files for sd in jobs[name]["file_sd_configs"] for files in sd["files"]]
        assert files == pattern, name
        directory, glob = pattern.split("/")
        assert (COLLECTOR / directory).is_dir(), f"collector/{directory}/ is missing"
        if directory == "workers":  # the names rlotel writes match the job's, and no other's
            kind = glob.removesuffix("-*.json")
            assert fnmatch.fnmatch(ray_integration.target_path(kind).name, glob), name
            assert not fnmatch.fnmatch(ray_integration.target_path("x" + kind).name, glob)
    keep = jobs["rollout-engines"]["relabel_configs"][0]
    assert keep == {"source_labels": ["replica"], "regex": ".+", "action": "keep"}


# --- the stack `rlotel stack DIR` writes --------------------------------------------------

# Command-line flags of the stack's images that name a config file inside the container.
CONFIG_FLAG = re.compile(r"^--?config(?:\.file)?=(/.+)$")


def mounts(service: dict[str, Any], root: Path) -> dict[PurePosixPath, Path]:
    """A service's bind mounts: container path → host path (relative to `root`)."""
    found = {}
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
            source, target = volume["source"], volume["target"]
        else:
            source, target = volume.split(":")[:2]
        found[PurePosixPath(target)] = (root / source).resolve()
    return found


def in_container(path: str, service: dict[str, Any], root: Path) -> Path | None:
    """Where a container path of `service` lies on the host: under the deepest mount that
    holds it, or None when no mount does (a path the image itself provides)."""
    wanted = PurePosixPath(path)
    holders = [target for target in mounts(service, root) if wanted.is_relative_to(target)]
    if not holders:
        return None
    target = max(holders, key=lambda t: len(t.parts))
    return mounts(service, root)[target].joinpath(*wanted.relative_to(target).parts)


def unresolved(root: Path) -> list[str]:
    """What the stack at `root` mounts or names that is not a file or folder inside `root`:
    every bind mount's source; each config file a service's command names; what the
    Prometheus config reads beside itself (rule files, discovery folders) and where Grafana
    looks for the dashboards."""
    compose = load(root / "docker-compose.yml")
    problems = []
    for name, service in compose["services"].items():
        for target, source in mounts(service, root).items():
            if not source.is_relative_to(root.resolve()):
                problems.append(f"{name}: {source} (mounted at {target}) is outside {root}")
            elif not source.exists():
                problems.append(f"{name}: {source} (mounted at {target}) does not exist")
        for argument in service.get("command") or []:
            flag = CONFIG_FLAG.match(str(argument))
            if flag:
                host = in_container(flag.group(1), service, root)
                if host is None or not host.is_file():
                    problems.append(f"{name}: {argument} is no file of the stack")
    prometheus = compose["services"]["prometheus"]
    config_path = in_container("/etc/prometheus/prometheus.yml", prometheus, root)
    assert config_path is not None
    config = load(config_path)
    for pattern in config.get("rule_files", []):
        if not list(config_path.parent.glob(pattern)):
            problems.append(f"prometheus: rule_files {pattern} matches nothing")
    for job in config["scrape_configs"]:
        for sd in job.get("file_sd_configs", []):
            for pattern in sd["files"]:
                if not (config_path.parent / pattern).parent.is_dir():
                    problems.append(f"prometheus: {job['job_name']} reads {pattern}: no folder")
    grafana = compose["services"]["grafana"]
    provisioning = in_container("/etc/grafana/provisioning", grafana, root)
    assert provisioning is not None
    for provider in load(provisioning / "dashboards" / "dashboards.yaml")["providers"]:
        boards = in_container(provider["options"]["path"], grafana, root)
        if boards is None or not list(boards.glob("*.json")):
            problems.append(f"grafana: no dashboards at {provider['options']['path']}")
    return problems


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    """`rlotel stack DIR`'s files, in a directory of their own."""
    directory = tmp_path_factory.mktemp("stack")
    write_stack(directory)
    return directory


def test_rlotel_stack_writes_the_repositorys_compose_file(written):
    """One owner: DIR/docker-compose.yml is the repository's file, byte for byte."""
    assert (written / "docker-compose.yml").read_bytes() == COMPOSE.read_bytes()
    assert (written / "docs" / "runbooks.md").read_bytes() == (
        ROOT / "docs" / "runbooks.md"
    ).read_bytes()


def test_every_mount_and_config_file_of_the_written_stack_resolves_inside_it(written):
    assert unresolved(written) == []
    checked = {
        name: sorted(
            str(source.relative_to(written)) for source in mounts(service, written).values()
        )
        for name, service in load(written / "docker-compose.yml")["services"].items()
    }
    assert checked["prometheus"] == ["collector"]
    assert checked["grafana"] == ["collector/grafana/provisioning", "dashboards"]
    assert checked["demo"] == []


def test_the_mount_check_rejects_what_a_stack_directory_does_not_hold(written, tmp_path):
    """The demo service as it was (the source tree mounted into /src), a mount out of DIR
    and a config path no mount holds: each one named."""
    shutil.copytree(written, tmp_path / "stack")
    root = tmp_path / "stack"
    compose = load(root / "docker-compose.yml")
    compose["services"]["demo"]["volumes"] = ["./pyproject.toml:/src/pyproject.toml:ro"]
    compose["services"]["tempo"]["volumes"] = ["../tempo.yaml:/etc/tempo.yaml:ro"]
    compose["services"]["alertmanager"]["command"] = ["--config.file=/etc/am/alertmanager.yml"]
    (root / "docker-compose.yml").write_text(yaml.safe_dump(compose))
    problems = unresolved(root)
    assert len(problems) == 4, problems
    assert any("demo:" in p and "pyproject.toml" in p and "does not exist" in p for p in problems)
    assert any(p.startswith("tempo:") and "outside" in p for p in problems)
    assert any(p.startswith("tempo: -config.file=/etc/tempo.yaml") for p in problems)
    assert any(p.startswith("alertmanager: --config.file=/etc/am/") for p in problems)


@pytest.mark.slow
def test_promtool_amtool_and_the_compose_spec_accept_the_written_stack(written):
    promtool, amtool = shutil.which("promtool"), shutil.which("amtool")
    checker = tool("check-jsonschema")
    assert promtool and amtool, "promtool and amtool: `make system-deps` installs them"
    assert checker, "check-jsonschema is not installed in the venv"
    config = run([promtool, "check", "config", str(written / "collector" / "prometheus.yml")])
    assert config.returncode == 0, config.stdout + config.stderr
    assert "SUCCESS: 1 rule files found" in config.stdout
    alerts = run([amtool, "check-config", str(written / "collector" / "alertmanager.yml")])
    assert alerts.returncode == 0, alerts.stdout + alerts.stderr
    compose = run(
        [checker, "--builtin-schema", "vendor.compose-spec", str(written / "docker-compose.yml")]
    )
    assert compose.returncode == 0, compose.stdout + compose.stderr
