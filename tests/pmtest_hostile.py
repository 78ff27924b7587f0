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


#: what a tamper function returns to drop the connection without an answer
DROP = object()


class TamperProxy:
    """``with TamperProxy(upstream, tamper) as p: p.url`` -- a loopback server forwarding to a real
    service ``upstream`` (answers asked in JSON) and passing each answer's document through
    ``tamper(method, path, doc) -> doc`` (:data:`DROP`: close the connection without answering).
    ``p.requests`` lists the ``(method, path)`` forwarded; ``p.close_listener()`` stops accepting
    connections (a client's next connect is refused)."""

    def __init__(self, upstream: str, tamper):
        import json

        import httpx

        self.requests: list[tuple[str, str]] = []
        self._http = httpx.Client(base_url=upstream, timeout=60)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def _forward(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else None
                proxy.requests.append((self.command, self.path))
                headers = {k: v for k, v in self.headers.items() if k.lower() in ("authorization", "content-type")}
                r = proxy._http.request(self.command, self.path, content=body, headers=headers)
                out = r.content
                if r.headers.get("content-type", "").startswith("application/json"):
                    doc = tamper(self.command, self.path, r.json())
                    if doc is DROP:
                        self.close_connection = True
                        return
                    out = json.dumps(doc).encode()
                send(self, r.status_code, out, content_type=r.headers.get("content-type", "application/json"))

            do_GET = do_POST = _forward

            def log_message(self, *a):  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._closed = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close_listener(self) -> None:
        if not self._closed:
            self._closed = True
            self.server.shutdown()
            self.server.server_close()

    def __enter__(self) -> "TamperProxy":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close_listener()
        self._http.close()
