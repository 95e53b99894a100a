"""Run an ASGI app under uvicorn on a background thread, on a free loopback port (tests, benches).

`with BackgroundServer(app) as server: ... server.url ...` starts a real HTTP server and stops it on
exit, so clients (the `openai` package, a browser) talk to it exactly as to `speczoo serve`. It binds
127.0.0.1 only and never outlives the `with` block.
"""

from __future__ import annotations

import socket
import threading
import time

import uvicorn


class BackgroundServer:
    def __init__(self, app, host: str = "127.0.0.1", start_timeout: float = 20.0):
        self.app, self.host, self.start_timeout = app, host, start_timeout
        self.port = 0
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> "BackgroundServer":
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, 0))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level="warning", lifespan="on", timeout_graceful_shutdown=5)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        name="speczoo-test-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + self.start_timeout
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the background server exited during startup (see its log above)")
            if time.monotonic() > deadline:
                self.__exit__(None, None, None)
                raise TimeoutError(f"the background server did not start within {self.start_timeout} s")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(15)
            if self._thread.is_alive():
                raise RuntimeError("the background server did not stop within 15 s")
        self._server = self._thread = None
