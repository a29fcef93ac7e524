"""The control plane's server: uvicorn on a thread of its own, started and closed
around the runtime by the agent's services (agent/services.py). Apart from app.py so
that the agent imports it without the `api` extra, and a missing extra is one line
naming it.

The socket is bound here, before anything is loaded into the kernel, so that a port
in use or an address that does not exist is a one-line UsageError, as for
--prometheus. uvicorn installs no signal handler outside the main thread: Ctrl-C
and SIGTERM stay the agent's, and `close()` ends the server within a few seconds
whatever its clients do.
"""

from __future__ import annotations

import importlib
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ....errors import ExtraMissing, UsageError

if TYPE_CHECKING:
    from ..config.schema import ControlPlaneConfig
    from ..control import Control

__all__ = ["ApiServer", "read_token", "require", "serve_api"]

OPTION = "--api-port"
START_S = 5.0  # the server thread must be serving within this
STOP_S = 3.0  # then it is told to drop its connections


def require() -> None:
    """ExtraMissing unless FastAPI, uvicorn and pydantic 2 can be imported."""
    try:
        for name in ("fastapi", "uvicorn", "pydantic"):
            importlib.import_module(name)
        pydantic = importlib.import_module("pydantic")
    except ImportError:
        raise ExtraMissing(OPTION, "api") from None
    if not str(getattr(pydantic, "VERSION", "1")).startswith("2"):
        raise ExtraMissing(f"{OPTION} (pydantic 2)", "api")


def read_token(path: str | None) -> bytes | None:
    """The bearer token in `path`: one line of printable ASCII, surrounding
    whitespace ignored. None without a file."""
    if path is None:
        return None
    flag = "--api-token-file"
    try:
        with open(path, "rb") as f:
            raw = f.read(4097)
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot read it: {exc.strerror}") from None
    token = raw.strip()
    if not token or len(raw) > 4096:
        raise UsageError(f"{flag} {path}: must hold a token of 1 to 4096 characters")
    if not all(33 <= b < 127 for b in token):
        raise UsageError(f"{flag} {path}: the token must be one word of printable ASCII")
    return token


def _bind(host: str, port: int) -> socket.socket:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, addr = infos[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        detail = exc.strerror or str(exc)
        raise UsageError(f"{OPTION} cannot listen on {host}:{port}: {detail}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise UsageError(f"{OPTION} cannot listen on {host}:{port}: {exc.strerror}") from None
    return sock


class _ToLog(logging.Handler):
    """uvicorn's errors as the agent's log lines (its warnings are about clients)."""

    def __init__(self, log: Callable[[str], None]) -> None:
        super().__init__(logging.ERROR)
        self.log = log

    def emit(self, record: logging.LogRecord) -> None:
        self.log(f"control plane: {record.getMessage()}")


class ApiServer:
    """uvicorn serving `app` on a bound socket, from the `sentinel-api` thread."""

    def __init__(self, app: Any, sock: socket.socket, log: Callable[[str], None]) -> None:
        import uvicorn

        self.sock = sock
        self.port = int(sock.getsockname()[1])
        config = uvicorn.Config(
            app,
            log_config=None,
            access_log=False,
            lifespan="off",
            http="h11",
            ws="none",
            loop="asyncio",
            limit_concurrency=64,
            timeout_keep_alive=5,
            timeout_graceful_shutdown=1,
            server_header=False,
        )
        self.server = uvicorn.Server(config)
        self._logger = logging.getLogger("uvicorn.error")
        self._handler = _ToLog(log)
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [sock]}, name="sentinel-api", daemon=True
        )

    def start(self) -> None:
        """Serve; UsageError if the server is not up within START_S."""
        self._logger.addHandler(self._handler)
        self._thread.start()
        end = time.monotonic() + START_S
        while not self.server.started and self._thread.is_alive() and time.monotonic() < end:
            time.sleep(0.01)
        if not self.server.started:
            self.close()
            raise UsageError(f"{OPTION}: the control plane did not start on port {self.port}")

    def close(self) -> None:
        """Stop serving: open requests get STOP_S to finish, then the connections go."""
        self.server.should_exit = True
        if self._thread.ident is not None:
            self._thread.join(STOP_S)
            if self._thread.is_alive():
                self.server.force_exit = True
                self._thread.join(STOP_S)
        self.sock.close()
        self._logger.removeHandler(self._handler)


def serve_api(cfg: ControlPlaneConfig, rt: Control, log: Callable[[str], None]) -> ApiServer:
    """The control plane of `rt` on `cfg.listen_address:listen_port`, serving."""
    require()
    token = read_token(cfg.token_file)
    sock = _bind(cfg.listen_address, cfg.listen_port)
    try:
        from .app import build_app
        from .guard import is_loopback

        local = is_loopback(cfg.listen_address)
        server = ApiServer(build_app(rt, token, log, loopback_only=local), sock, log)
    except BaseException:
        sock.close()
        raise
    server.start()
    if token is None and not local:
        log(f"control plane on {cfg.listen_address} without a token: see --api-token-file")
    return server
