"""The WSGI app on the `/metrics` listener: prometheus_client's own app for the registry,
small apps beside it for other paths (the driver's `/targets`), basic auth around both."""

from __future__ import annotations

import base64
import hmac
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, make_wsgi_app

# (content type, body) per request; it must not raise.
Route = Callable[[], tuple[str, bytes]]


def metrics_app(registry: CollectorRegistry, routes: dict[str, Route]) -> Callable:
    """`routes` by path (read per request, so routes added later are served too), anything
    else prometheus_client's app: Accept negotiation, gzip, `name[]` filters."""
    metrics = make_wsgi_app(registry)

    def app(environ: dict, start_response: Callable) -> Iterable[bytes]:
        route = routes.get(environ.get("PATH_INFO", ""))
        if route is None:
            return metrics(environ, start_response)
        content_type, body = route()
        start_response(
            "200 OK", [("Content-Type", content_type), ("Content-Length", str(len(body)))]
        )
        return [body]

    return app


def basic_auth(app: Callable, username: str, password: str) -> Callable:
    """401 unless the request carries these credentials (prometheus_client has no
    server-side auth); compared in constant time."""
    expected = ("Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()).encode()

    def guarded(environ: dict, start_response: Callable) -> Iterable[bytes]:
        given = environ.get("HTTP_AUTHORIZATION", "").encode()
        if hmac.compare_digest(given, expected):
            return app(environ, start_response)
        start_response(
            "401 Unauthorized",
            [("WWW-Authenticate", 'Basic realm="rlotel"'), ("Content-Length", "0")],
        )
        return [b""]

    return guarded
