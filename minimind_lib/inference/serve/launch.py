"""Running the server: uvicorn on a thread of this process (``BackgroundServer``: tests, the
notebook) or in a child process (``launch_server_process``), and the CLI's defaults.
"""


import contextlib
import os
import socket
import subprocess
import sys
import threading
import time

DEFAULT_PORT = 8998
API_KEY_ENV = "MINIMIND_API_KEY"  # where ``python -m minimind_lib serve`` finds a key

# --------------------------------------------------------------------------- running it


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (for tests and the notebook)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


#: seconds a connection may take to send a request's line and headers (the first one, or the
#: next on a kept-alive connection); a slower client is disconnected, so half-open connections
#: (a slow-headers flood) cannot pile up until the process runs out of file handles
HEADERS_TIMEOUT_SECONDS = 10.0
#: connections served at once; past it uvicorn answers 503 at once instead of queueing more
MAX_CONNECTIONS = 512


def headers_deadline_protocol():
    """uvicorn's h11 protocol with a deadline on every request head (``HEADERS_TIMEOUT_SECONDS``):
    uvicorn itself times out only idle kept-alive connections, after a first response."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeadersDeadline(H11Protocol):
        _deadline = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def handle_events(self) -> None:
            cycle = self.cycle
            super().handle_events()
            if self.cycle is not cycle:  # a request's head arrived: the deadline is met
                self._cancel()

        def on_response_complete(self) -> None:
            self._arm()  # first: a pipelined request handled inside super() cancels it again
            super().on_response_complete()

        def connection_lost(self, exc) -> None:
            self._cancel()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._cancel()
            self._deadline = self.loop.call_later(HEADERS_TIMEOUT_SECONDS, self._expire)

        def _cancel(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expire(self) -> None:
            if not self.transport.is_closing():
                self.transport.close()

    return HeadersDeadline


def uvicorn_config(app: object, host: str, port: int, log_level: str = "warning"):
    """The uvicorn settings every server of the course runs with (the CLI's and
    ``BackgroundServer``'s): the request-head deadline and the connection limit above."""
    import uvicorn

    return uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on",
                          http=headers_deadline_protocol(), limit_concurrency=MAX_CONNECTIONS)


class BackgroundServer:
    """Run ``app`` under uvicorn on a thread of this process (tests, notebook)::

        with BackgroundServer(app) as server:
            httpx.get(server.url + "/v1/models")

    ``port=0`` lets the OS pick a free port; ``url`` says which.
    """

    def __init__(self, app: object, host: str = "127.0.0.1", port: int = 0) -> None:
        import uvicorn

        self.server = uvicorn.Server(uvicorn_config(app, host, port))
        self.host = host
        self._thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)

    @property
    def url(self) -> str:
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://{self.host}:{port}"

    def __enter__(self) -> "BackgroundServer":
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start (is the port in use?)")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=30)


def launch_server_process(model_dir: str | os.PathLike | None = None, port: int | None = None,
                          host: str = "127.0.0.1", profile: str | None = None,
                          device: str | None = None, api_key: str | None = None,
                          timeout: float = 120.0) -> tuple[subprocess.Popen, str]:
    """Start ``python -m minimind_lib serve`` in a background process and wait until it answers.

    Returns ``(process, base_url)``; stop it with ``process.terminate()``. ``api_key`` goes to
    the server through ``$MINIMIND_API_KEY`` (not the command line, which others can list).
    """
    import httpx

    port = port or free_port(host)
    cmd = [sys.executable, "-m", "minimind_lib", "serve", "--host", host, "--port", str(port)]
    if model_dir is not None:
        cmd += ["--model", str(model_dir)]
    if profile is not None:
        cmd += ["--profile", profile]
    if device is not None:
        cmd += ["--device", device]
    env = {**os.environ, API_KEY_ENV: api_key or ""}
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)
    url, deadline = f"http://{host}:{port}", time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with code {proc.returncode}:\n"
                               f"{proc.stdout.read()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/v1/models", headers=headers, timeout=1).status_code == 200:
                return proc, url
        time.sleep(0.2)
    proc.terminate()
    raise TimeoutError(f"the server did not answer on {url} within {timeout:.0f} s")
