"""`/metrics`: the series store served to Prometheus through prometheus_client.

The endpoint only reads the store the recorder writes; the training thread touches
neither.
"""

from __future__ import annotations

from rlotel.publish.sink import Sink
from rlotel.series.store import SeriesStore
from rlotel.sinks.metrics import endpoint, exposition, wsgi


class PrometheusEndpoint(Sink):
    """Serves one store; a sink only for its lifecycle (shutdown closes the listener)."""

    def __init__(self, store: SeriesStore) -> None:
        self.registry = exposition.registry(store)
        self._server: endpoint.Server | None = None
        self._routes: dict[str, wsgi.Route] = {}
        self.url: str | None = None

    def add_route(self, path: str, handler: wsgi.Route) -> None:
        """Serve `path` next to /metrics (same listener, TLS and credentials): `handler`
        returns (content type, body) per request and must not raise."""
        self._routes[path] = handler

    def serve(
        self,
        addr: str,
        port: int,
        tls: tuple[str, str] | None = None,
        credentials: tuple[str, str] | None = None,
        port_retries: int = 0,
    ) -> str:
        app = wsgi.metrics_app(self.registry, self._routes)
        if credentials is not None:
            app = wsgi.basic_auth(app, *credentials)
        self._server = endpoint.serve(app, addr, port, tls, port_retries)
        host = f"[{addr}]" if ":" in addr else addr
        scheme = "https" if tls else "http"
        self.url = f"{scheme}://{host}:{self._server.server_port}/metrics"
        return self.url

    def release_in_child(self) -> None:
        """In a forked child: close its copy of the listening socket (the serving threads
        stayed in the parent), so a child that outlives the parent does not hold the port."""
        if self._server is not None:
            self._server.socket.close()
            self._server = None

    def shutdown(self, deadline: float) -> None:
        if self._server is not None:
            endpoint.stop(self._server, deadline)
            self._server = None
