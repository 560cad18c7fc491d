"""The /metrics HTTP endpoint: a WSGI app on a threading server, optionally behind TLS and
HTTP basic auth (loopback-only by default, so neither is needed unless you bind wider)."""

from __future__ import annotations

import base64
import hmac
import socket
import ssl
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from rlotel.config import ConfigError


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        """A client that speaks plain HTTP to TLS, or hangs up mid-scrape, is its problem:
        no traceback on the training job's stderr."""


class _QuietHandler(WSGIRequestHandler):
    wbufsize = -1  # status, headers and body leave in one or two sends, not five

    def log_message(self, format: str, *args) -> None:
        """Scrapes are not worth a log line each."""


def basic_auth(app: Callable, username: str, password: str) -> Callable:
    """WSGI middleware: 401 unless the request carries these credentials."""
    expected = "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()

    def guarded(environ: dict, start_response: Callable) -> Iterable[bytes]:
        given = environ.get("HTTP_AUTHORIZATION", "")
        if hmac.compare_digest(given.encode(), expected.encode()):
            return app(environ, start_response)
        start_response(
            "401 Unauthorized",
            [("WWW-Authenticate", 'Basic realm="rlotel"'), ("Content-Length", "0")],
        )
        return [b""]

    return guarded


def serve(
    app: Callable,
    addr: str,
    port: int,
    tls: tuple[str, str] | None = None,
    credentials: tuple[str, str] | None = None,
) -> WSGIServer:
    """Start the endpoint on a daemon thread; configuration errors raise ConfigError."""
    if credentials is not None:
        app = basic_auth(app, *credentials)
    server_class = type("Server", (_ThreadingServer,), {})
    server_class.address_family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    try:
        server = make_server(addr, port, app, server_class, handler_class=_QuietHandler)
    except (OSError, TypeError, ValueError, UnicodeError) as error:
        raise ConfigError(
            f"cannot serve /metrics on {addr!r}:{port}: "
            f"{getattr(error, 'strerror', None) or error}; choose a free "
            "prometheus_port (0 = ephemeral) or prometheus_port=None for no endpoint"
        ) from None
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(*tls)
        except (OSError, ssl.SSLError) as error:
            server.server_close()
            raise ConfigError(
                f"prometheus_tls (certfile, keyfile) cannot be loaded: {error}"
            ) from None
        # The handshake happens in the request's own thread, so a client that connects and
        # stalls cannot hold up the accept loop.
        server.socket = context.wrap_socket(
            server.socket, server_side=True, do_handshake_on_connect=False
        )
    threading.Thread(target=server.serve_forever, name="rlotel-metrics", daemon=True).start()
    return server
