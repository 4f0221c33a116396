"""optuna-dashboard behind the guard the MLflow UI has: a foreign Host, and a cross-origin write, are refused (403).

`hmmscope ui --optuna-dashboard` runs `python -m hmmscope.ui.dashboard_guard --host=127.0.0.1 --port=P -- STORAGE`
(`servers.optuna_dashboard`): optuna-dashboard's own WSGI app (`optuna_dashboard.wsgi`) wrapped in `HostGuard`,
served by wsgiref's threaded server, as optuna-dashboard's command serves it. optuna-dashboard checks neither
header: a page on any site could point its own name at 127.0.0.1 (DNS rebinding) and delete studies with requests
the browser sends as same-origin, carrying `Host: <that name>`. The guard, as MLflow's security middleware:

- Host: only a loopback name (127.0.0.1, localhost, [::1]), with or without a port, is served (the server listens
  on 127.0.0.1 only, so no other name is a legitimate way to reach it); anything else, or none, is 403. The header
  is parsed strictly as host[:port]: `[::1]evil.example` or `[::1]:80@evil.example` is not a loopback name.
- Writes (POST, PUT, PATCH, DELETE): an Origin header that is not a loopback origin is 403, as is a browser's
  `Sec-Fetch-Site: cross-site` without one; clients that send neither (curl, scripts) are not browsers and pass.

Imports optuna-dashboard only in `main` (the child process); must not import the rest of hmmscope but
`sweep.storage` (the storage URL forms).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import optuna_dashboard

from ..sweep.storage import dashboard_storage

LOOPBACK = ("127.0.0.1", "localhost", "[::1]")
WRITES = ("POST", "PUT", "PATCH", "DELETE")


# a Host header is host[:port] (RFC 9110 7.2, RFC 3986 3.2.2): a bracketed IPv6 literal or a name / IPv4 address,
# then at most a colon and digits; nothing after them (no `@`, no second name, no path)
_HOST = re.compile(r"(\[[0-9a-f:.]+\]|[a-z0-9.-]+)(?::[0-9]{1,5})?", re.ASCII)


def _host_name(host: str) -> str | None:
    """'127.0.0.1:8080' -> '127.0.0.1'; '[::1]:8080' -> '[::1]'; lower case; None for anything that is not exactly
    host[:port] (`[::1]evil.example`, `[::1]@evil`, `[::1]:80@evil.example`, a bare `::1`)."""
    m = _HOST.fullmatch(host.strip().lower())
    return m.group(1) if m else None


def loopback_host(host: str | None) -> bool:
    return bool(host) and _host_name(host) in LOOPBACK


def loopback_origin(origin: str) -> bool:
    """An Origin header is scheme://host[:port] (RFC 6454), nothing after it; its host parsed as a Host header is."""
    scheme, sep, rest = origin.strip().lower().partition("://")
    return bool(sep) and scheme in ("http", "https") and loopback_host(rest)


def refusal(environ: dict) -> str | None:
    """Why the request must be refused (a line), or None."""
    host = environ.get("HTTP_HOST")
    if not loopback_host(host):
        return f"Host {host!r} is not a loopback name: this server answers on 127.0.0.1 only (DNS rebinding guard)"
    if environ.get("REQUEST_METHOD", "GET").upper() in WRITES:
        origin = environ.get("HTTP_ORIGIN")
        if origin is not None and not loopback_origin(origin):
            return f"cross-origin {environ['REQUEST_METHOD']} from {origin!r} refused"
        if origin is None and environ.get("HTTP_SEC_FETCH_SITE", "").lower() == "cross-site":
            return f"cross-site {environ['REQUEST_METHOD']} refused"
    return None


class HostGuard:
    """WSGI middleware: `refusal` -> 403 with the reason as plain text; anything else goes to `app`."""

    def __init__(self, app: Callable):
        self.app = app

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        why = refusal(environ)
        if why is None:
            return self.app(environ, start_response)
        body = f"Forbidden: {why}\n".encode()
        start_response("403 Forbidden", [("Content-Type", "text/plain; charset=utf-8"),
                                         ("Content-Length", str(len(body)))])
        return [body]


def main(argv: list[str] | None = None) -> None:


    ap = argparse.ArgumentParser(prog="python -m hmmscope.ui.dashboard_guard")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("storage")
    a = ap.parse_args(argv)

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args) -> None:  # no per-request lines
            pass

    app = HostGuard(optuna_dashboard.wsgi(dashboard_storage(a.storage)))
    httpd = make_server(a.host, a.port, app, server_class=Server, handler_class=Quiet)
    print(f"optuna-dashboard (Host/Origin guard) on http://{a.host}:{a.port}/", file=sys.stderr, flush=True)
    httpd.serve_forever()


if __name__ == "__main__":
    main()
