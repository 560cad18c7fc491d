"""The `/metrics` listener: prometheus_client's threading WSGI server on a daemon thread,
optionally behind TLS (loopback-only by default, so it is not needed unless you bind
wider). Bad addresses, unreadable certificates and taken ports raise ConfigError."""

from __future__ import annotations

import contextlib
import errno
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client.exposition import ThreadingWSGIServer

from rlotel.base.errors import ConfigError

# How often the accept loop looks for a shutdown request (socketserver's default). Each
# look wakes the thread and takes the GIL from the training thread, so it is rare; `stop`
# does not wait for it.
SHUTDOWN_POLL_S = 0.5

log = logging.getLogger("rlotel")


class Server(ThreadingWSGIServer):
    """One daemon thread per connection (prometheus_client's server)."""

    def handle_error(self, request, client_address) -> None:
        """A client that speaks plain HTTP to TLS, or hangs up mid-scrape, is its problem:
        no traceback on the training job's stderr."""


class QuietHandler(WSGIRequestHandler):
    timeout = 10  # seconds a stalled client may hold its thread, instead of forever

    def log_message(self, format: str, *args) -> None:
        """Scrapes are not worth a line each on the training job's stderr."""


def serve(
    app: Callable,
    addr: str,
    port: int,
    tls: tuple[str, str] | None = None,
    port_retries: int = 0,
) -> Server:
    """Start serving `app` on a daemon thread.

    A busy `port` is an error unless `port_retries` allows the next ones (one per rank when
    several processes on a node each serve their own `/metrics`)."""
    context = None if tls is None else tls_context(*tls)
    server = bind(app, addr, port, port_retries)
    if context is not None:
        # The handshake happens in the connection's own thread, so a client that connects
        # and stalls cannot hold up the accept loop (and every scrape behind it).
        server.socket = context.wrap_socket(
            server.socket, server_side=True, do_handshake_on_connect=False
        )
    threading.Thread(
        target=server.serve_forever,
        kwargs={"poll_interval": SHUTDOWN_POLL_S},
        name="rlotel-metrics",
        daemon=True,
    ).start()
    return server


def stop(server: Server, deadline: float) -> None:
    """End the accept loop and close the listening socket, waiting for the loop until
    `deadline` (`time.monotonic()`) at most. Shutting the socket down wakes the loop at once
    (Linux) instead of at its next look for the request (`SHUTDOWN_POLL_S`)."""
    stopper = threading.Thread(target=server.shutdown, name="rlotel-metrics-stop", daemon=True)
    stopper.start()
    with contextlib.suppress(OSError):
        server.socket.shutdown(socket.SHUT_RDWR)
    stopper.join(max(0.0, deadline - time.monotonic()))
    server.server_close()


def tls_context(certfile: str, keyfile: str) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(certfile, keyfile)
    except (OSError, ssl.SSLError) as error:
        raise ConfigError(f"prometheus_tls (certfile, keyfile) cannot be loaded: {error}") from None
    return context


def bind(app: Callable, addr: str, port: int, retries: int) -> Server:
    server_class = type("Server", (Server,), {})
    server_class.address_family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    last = min(65535, port + retries) if port else port
    candidate = port
    while True:
        try:
            server = make_server(addr, candidate, app, server_class, handler_class=QuietHandler)
        except OSError as error:
            if error.errno == errno.EADDRINUSE and candidate < last:
                candidate += 1
                continue
            tried = f"{port}" if last == port else f"{port}–{last}"
            raise ConfigError(
                f"cannot serve /metrics on {addr!r}:{tried}: {error.strerror or error}; "
                "choose a free prometheus_port (0 = ephemeral), allow "
                "prometheus_port_retries, or prometheus_port=None for no endpoint"
            ) from error  # the cause: what `rlotel.integrations.process` tells verl's user
        except (TypeError, ValueError, UnicodeError) as error:
            raise ConfigError(
                f"cannot serve /metrics on {addr!r}:{port}: {error}; give prometheus_addr "
                "as a host address such as 127.0.0.1"
            ) from None
        if candidate != port:
            log.warning("rlotel: port %d is in use; serving /metrics on %d", port, candidate)
        return server
