"""The process's telemetry for the zero-code integrations, started on first use.

The verl plugin's timers, Tracking backend, agent-loop and V1 patches all record into the
telemetry `rlotel.init` made (or, in a Ray worker, the worker's own), configured from the
environment (`rlotel.env`). A module of its own so that the patches need not import
each other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlotel import env

if TYPE_CHECKING:
    from rlotel.telemetry import Telemetry


def telemetry(run: str | None = None, serve: bool = False, **kwargs: Any) -> Telemetry:
    """The process's telemetry, created on first use from the environment (in a Ray
    worker, with the worker's role, rank and node: `verl_workers.worker_telemetry`).
    `serve` opens the driver's `/metrics` (`OTEL_EXPORTER_PROMETHEUS_HOST`/`_PORT`)."""
    import rlotel

    tel = rlotel.current()
    if tel is not None:
        return tel
    from rlotel.integrations import verl_workers

    if verl_workers.in_ray_actor():
        return verl_workers.worker_telemetry()
    environment = env.Environment.read()
    port: int | None = None
    if serve:
        port = environment.prometheus_port or env.DEFAULT_PROMETHEUS_PORT
    return rlotel.init(
        run=run or environment.run or "verl",
        prometheus_addr=environment.prometheus_host or "127.0.0.1",
        prometheus_port=port,
        traces_file=environment.traces_file,
        **kwargs,
    )
