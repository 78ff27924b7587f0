"""Run the service with uvicorn: in the foreground (``pm-vector serve``) or in a thread on loopback
with a free port (``pm-vector demo``, the load test, the tests)."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn

from .settings import ServiceSettings
from .app import create_app
from .header_timeout import protocol_class


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _config(app, host: str, port: int, log_level: str, header_timeout_s: float = 10.0):
    # uvicorn's httptools protocol with a header-read timeout (service/header_timeout.py)
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False, lifespan="on",
                          timeout_keep_alive=30, backlog=2048, http=protocol_class(header_timeout_s))


def serve(settings: ServiceSettings, *, log_level: str = "info") -> None:
    """Serve in the foreground until interrupted."""
    uvicorn.Server(_config(create_app(settings), settings.host, settings.port, log_level,
                           settings.header_timeout_s)).run()


class ServiceThread:
    """``with ServiceThread(settings) as svc: svc.url`` -- uvicorn in a daemon thread on 127.0.0.1."""

    def __init__(self, settings: ServiceSettings | None = None, *, port: int | None = None, log_level: str = "warning",
                 pool=None):
        # request_nice 0: a service in a thread shares its host's process (an application, the demo, the
        # tests); lowering that process's threads is for a process of the service's own (pm-vector serve)
        self.settings = (settings or ServiceSettings.from_env()).with_(host="127.0.0.1", request_nice=0)
        self.port = port or free_port()
        self.app = create_app(self.settings, pool=pool)
        self.server = uvicorn.Server(_config(self.app, "127.0.0.1", self.port, log_level,
                                             self.settings.header_timeout_s))
        self.server.install_signal_handlers = lambda: None  # type: ignore[method-assign]  # not the main thread
        self.thread = threading.Thread(target=self.server.run, name="pm_vector_service", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> "ServiceThread":
        self.thread.start()
        t0 = time.monotonic()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the service thread ended during start-up (see the log above).")
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"the service did not start within {timeout:.0f} s.")
            time.sleep(0.02)
        return self

    def stop(self, timeout: float = 15.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)

    def __enter__(self) -> "ServiceThread":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
