"""Start-up in a process rlotel was not asked to own (verl's trainer and workers, a Ray
worker): training runs whatever rlotel's configuration says, so this never raises. What
cannot start as configured is left out and one warning says what and why; `rlotel.init` in
the user's own code still raises `ConfigError` (the user asked for that configuration).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlotel.base import env
from rlotel.base.errors import ConfigError

if TYPE_CHECKING:
    from rlotel.telemetry import Telemetry

log = logging.getLogger("rlotel")


def start(moved: Callable[[Telemetry], str] | None = None, **options: Any) -> Telemetry:
    """`rlotel.init(**options)` that never raises. Bad variables read as their defaults,
    an unwritable traces file or directory is left out (its spans counted as dropped), a
    taken `/metrics` port becomes an ephemeral one (`moved(tel)` registers it and says
    where); one warning lists what was left out and why."""
    environment = options.pop("environment", None) or env.Environment.read()
    left_out = list(environment.problems)
    options = _accepted({**options, "environment": environment}, left_out)
    tel = _started(options, left_out, moved)
    if left_out:
        log.warning("rlotel: started without part of its configuration: %s", "; ".join(left_out))
    return tel


# What `start` puts instead of an option verl's configuration gave and `rlotel.init` refuses.
_INSTEAD = (
    ({"run": "verl"}, "run 'verl' used"),
    ({"profile": None, "step_hooks": ()}, "no profiling"),
)


def _accepted(options: dict[str, Any], left_out: list[str]) -> dict[str, Any]:
    """`options` less each part `rlotel.init` would refuse, each checked on its own."""
    environment = options["environment"]
    if (error := _refusal(environment=environment)) is not None:
        left_out.append(f"{error} (its spans are dropped and counted)")
        options["environment"] = replace(environment, traces_dir=None)
        options["span_exporters"] = [
            *options.get("span_exporters", ()),
            _failing_exporter(environment.traces_dir),
        ]
    traces_file = options.get("traces_file")
    if traces_file is not None and (error := _refusal(traces_file=traces_file)) is not None:
        left_out.append(f"{error} (its spans are dropped and counted)")
        options["traces_file"] = None
        options["span_exporters"] = [
            *options.get("span_exporters", ()),
            _failing_exporter(traces_file),
        ]
    for instead, outcome in _INSTEAD:
        given = {key: options[key] for key in instead if key in options}
        if given and (error := _refusal(**given)) is not None:
            left_out.append(f"{error} ({outcome})")
            options.update(instead)
    return options


def _refusal(**options: Any) -> ConfigError | None:
    """What `rlotel.init` says to these options alone, or None when it takes them."""
    from rlotel.config import Config

    bare = {"prometheus_port": None, "environment": env.Environment.read({})}
    try:
        Config(**{**bare, **options}).validated()
    except ConfigError as error:
        return error
    return None


def _started(
    options: dict[str, Any], left_out: list[str], moved: Callable[[Telemetry], str] | None
) -> Telemetry:
    """`rlotel.init` with `/metrics` where configured; a port taken (another run on this
    node) → an ephemeral one; a bad address → none. The last resort (nothing exported,
    nothing to refuse) cannot fail."""
    import rlotel

    port = options.get("prometheus_port")
    attempts = [options]
    if port:
        attempts.append({**options, "prometheus_port": 0})
    if port is not None:
        attempts.append({**options, "prometheus_port": None, "prometheus_addr": "127.0.0.1"})
    first: ConfigError | None = None
    for attempt in attempts:
        try:
            tel = rlotel.init(**attempt)
        except ConfigError as error:
            first = first or error
            continue
        if first is not None and attempt["prometheus_port"] == 0:
            where = moved(tel) if moved is not None else ""
            cause = first.__cause__
            taken = cause.strerror if isinstance(cause, OSError) and cause.strerror else first
            left_out.append(
                f"/metrics on {options['prometheus_addr']}:{port}: {taken} "
                f"(serving on {tel.metrics_url} instead{where})"
            )
        elif first is not None:
            left_out.append(f"{first} (no /metrics)")
        return tel
    left_out.append(f"{first} (nothing exported)")
    bare = replace(env.Environment.read({}), sdk_disabled=True)
    return rlotel.init(run="verl", prometheus_port=None, environment=bare)


def _failing_exporter(path: str | Path) -> Any:
    """An OTel span exporter that fails every batch: the spans a sink that could not start
    would have written are counted as `export_failed` instead."""
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class Unwritable(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            log.debug("rlotel: %d spans not written: %s is not writable", len(spans), path)
            return SpanExportResult.FAILURE

    return Unwritable()
