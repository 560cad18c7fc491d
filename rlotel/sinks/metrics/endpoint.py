"""The /metrics HTTP endpoint: a WSGI app served by a few long-lived threads, optionally
behind TLS and HTTP basic auth (loopback-only by default, so neither is needed unless you
bind wider)."""

from __future__ import annotations

import base64
import errno
import hmac
import logging
import queue
import socket
import ssl
import threading
from collections.abc import Callable, Iterable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from rlotel.errors import ConfigError

# How often the accept loop looks for a shutdown request: socketserver's 0.5 s default
# was half a second added to every exit; a 50 ms select costs nothing measurable.
SHUTDOWN_POLL_S = 0.05

log = logging.getLogger("rlotel")


class _PooledServer(WSGIServer):
    """Connections go to reused worker threads. A new thread per connection (what
    ThreadingMixIn does) costs more CPU than the scrape itself here (≈0.13 of 0.23 ms), all
    of it under the GIL the training loop needs. Workers are added only when none is idle
    (stalled clients, bursts), up to `max_workers`, and retire after `idle_exit_s` idle, so
    a stalled client cannot hold up other scrapes and a flood cannot spawn without bound."""

    max_workers = 32
    idle_exit_s = 30.0
    request_queue_size = 128  # listen backlog; socketserver's 5 drops SYNs in a burst

    def __init__(self, *args, **kwargs) -> None:
        self._connections: queue.SimpleQueue = queue.SimpleQueue()
        self._pool_lock = threading.Lock()
        self._workers = 0
        self._busy = 0  # connections handed over and not yet finished (queued or served)
        super().__init__(*args, **kwargs)

    def process_request(self, request, client_address) -> None:
        with self._pool_lock:
            if self._busy >= self._workers < self.max_workers:  # every worker is taken
                self._workers += 1
                threading.Thread(target=self._work, name="rlotel-metrics", daemon=True).start()
            self._busy += 1
            self._connections.put((request, client_address))  # beyond the cap: it waits

    def _work(self) -> None:
        while True:
            try:
                connection = self._connections.get(timeout=self.idle_exit_s)
            except queue.Empty:
                with self._pool_lock:
                    if self._workers > self._busy:  # more workers than work: retire
                        self._workers -= 1
                        return
                continue
            if connection is None:  # server_close
                return
            request, client_address = connection
            try:
                self.finish_request(request, client_address)
            except Exception:
                self.handle_error(request, client_address)
            finally:
                self.shutdown_request(request)
                with self._pool_lock:
                    self._busy -= 1

    def server_close(self) -> None:
        super().server_close()
        with self._pool_lock:
            for _ in range(self._workers):
                self._connections.put(None)

    def handle_error(self, request, client_address) -> None:
        """A client that speaks plain HTTP to TLS, or hangs up mid-scrape, is its problem:
        no traceback on the training job's stderr."""


class _QuietHandler(WSGIRequestHandler):
    wbufsize = -1  # status, headers and body leave in one or two sends, not five
    timeout = 10  # seconds a client may stall a read or write (and hold its worker)

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
    port_retries: int = 0,
) -> WSGIServer:
    """Start the endpoint on a daemon thread; configuration errors raise ConfigError.

    A busy `port` is an error unless `port_retries` allows the next ones (one per rank when
    several processes on a node each serve their own `/metrics`)."""
    if credentials is not None:
        app = basic_auth(app, *credentials)
    server = _bind(app, addr, port, port_retries)
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
    threading.Thread(
        target=server.serve_forever,
        kwargs={"poll_interval": SHUTDOWN_POLL_S},
        name="rlotel-metrics",
        daemon=True,
    ).start()
    return server


def _bind(app: Callable, addr: str, port: int, retries: int) -> WSGIServer:
    server_class = type("Server", (_PooledServer,), {})
    server_class.address_family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    last = min(65535, port + retries) if port else port
    candidate = port
    while True:
        try:
            server = make_server(addr, candidate, app, server_class, handler_class=_QuietHandler)
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
