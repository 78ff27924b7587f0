"""A hostile HTTP server on loopback for client tests: ``with Hostile(answer) as h: h.url``.

``answer(handler)`` writes whatever it likes on the raw connection (``handler.wfile``): a status
line and headers of its choosing, a body trickled byte by byte, a body that lies about its
length or encoding. ``h.requests`` lists the ``(method, path)`` it was asked."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Hostile:
    def __init__(self, answer):
        self.requests: list[tuple[str, str]] = []
        hostile = self

        class Handler(BaseHTTPRequestHandler):
            def _any(self):
                n = int(self.headers.get("Content-Length") or 0)
                if n:
                    self.rfile.read(n)
                hostile.requests.append((self.command, self.path))
                try:
                    answer(self)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            do_GET = do_POST = _any

            def log_message(self, *a):  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> "Hostile":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def send(handler, status: int, body: bytes, headers: dict[str, str] | None = None, *,
         content_type: str = "application/json", length: int | None = None) -> None:
    """One answer: ``status``, ``headers``, ``Content-Length`` (``length``, else the body's)."""
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body) if length is None else length))
    for k, v in (headers or {}).items():
        handler.send_header(k, v)
    handler.end_headers()
    handler.wfile.write(body)


def trickle(handler, raw: bytes, every: float) -> None:
    """Write ``raw`` (status line, headers and body) one byte every ``every`` seconds."""
    for i in range(len(raw)):
        handler.wfile.write(raw[i:i + 1])
        handler.wfile.flush()
        time.sleep(every)
