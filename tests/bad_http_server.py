"""A tiny misbehaving HTTP server for the store tests (tests/test_stores.py): `python bad_http_server.py MODE PORT_FILE`.

It binds 127.0.0.1 on a free port, writes the port to PORT_FILE, and serves until it is killed (by its pid):
- silent: accepts every connection and never answers a byte;
- drip: answers /health at once, and every other request with a 200 header and a body of one byte a second, for ever;
- 500w: an MLflow tracking server that reads but cannot write: /health, experiments/search (no experiments) and
  experiments/get-by-name (none: 404 RESOURCE_DOES_NOT_EXIST) answer as MLflow does; every POST answers 500.
"""

from __future__ import annotations

import http.server
import json
import socket
import sys
import threading
import time
from pathlib import Path


class Handler(http.server.BaseHTTPRequestHandler):
    mode = "500w"

    def log_message(self, *a):
        pass

    def _send(self, code: int, body: dict | str) -> None:
        raw = (json.dumps(body) if isinstance(body, dict) else body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json" if isinstance(body, dict) else "text/plain")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self):
        if self.path.startswith("/health"):
            return self._send(200, "OK")
        if self.mode == "drip":
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "100000")
            self.end_headers()
            while True:
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(1.0)
        if "/experiments/search" in self.path:
            return self._send(200, {"experiments": []})
        if "/experiments/get-by-name" in self.path:
            return self._send(404, {"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "no such experiment"})
        return self._send(404, {"error_code": "ENDPOINT_NOT_FOUND", "message": self.path})

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(n)
        self._send(500, {"error_code": "INTERNAL_ERROR", "message": "the disk is full"})


def silent(sock: socket.socket) -> None:
    held = []
    while True:
        conn, _ = sock.accept()
        held.append(conn)  # never closed, never answered


def main() -> None:
    mode, port_file = sys.argv[1], Path(sys.argv[2])
    if mode == "silent":
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        port_file.write_text(str(sock.getsockname()[1]))
        silent(sock)
    Handler.mode = mode
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    port_file.write_text(str(srv.server_address[1]))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
