"""What stands in front of the control plane's app (ASGI middleware), checked before
FastAPI reads anything: the Host (a loopback server answers loopback names only, so
that a web page cannot reach it through DNS rebinding), the bearer token (compared in
constant time), the body size (413 before the app reads it), and a last catch of
anything the app raised: logged, and 500 only if nothing was sent yet.

Its answers are the API's error body, `{"error": ..., "field": null}`.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import KW_ONLY, dataclass
from typing import Any

__all__ = ["MAX_BODY", "Guard", "is_loopback"]

MAX_BODY = 64 << 10  # bytes: the largest valid request (1,024 targets) is about 40 KiB

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def is_loopback(host: str) -> bool:
    """localhost, 127.0.0.0/8 or ::1 (brackets and a port allowed: a Host header)."""
    name = host[1 : host.find("]")] if host.startswith("[") else host.partition(":")[0]
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


@dataclass
class Guard:
    """The middleware. `loopback_only`: refuse a Host that is not a loopback name."""

    app: ASGIApp
    token: bytes | None
    log: Callable[[str], None]
    _: KW_ONLY
    loopback_only: bool = False
    limit: int = MAX_BODY

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            host = _header(scope, b"host")
            if self.loopback_only and host is not None and not is_loopback(host):
                await _send(send, 403, f"Host {host!r}: this agent answers loopback names only")
                return
            if self.token is not None and not self._authorized(scope):
                why = "a bearer token is required: Authorization: Bearer TOKEN"
                await _send(send, 401, why, [(b"www-authenticate", b'Bearer realm="meridian"')])
                return
            body = await self._body(scope, receive)
            if body is None:
                await _send(send, 413, f"the body is over {self.limit} bytes")
                return
            await self.app(scope, _replay(body, receive), sending)
        except Exception as exc:
            where = f"{scope.get('method', '')} {scope.get('path', '')}"
            self.log(f"control plane: {where}: internal error: {type(exc).__name__}: {exc}")
            if not started:
                await _send(send, 500, "internal error: the agent logged it")

    def _authorized(self, scope: Scope) -> bool:
        assert self.token is not None
        value = _header(scope, b"authorization")
        if value is None:
            return False
        scheme, _, given = value.encode("latin-1").partition(b" ")
        ok = hmac.compare_digest(given.strip(), self.token)
        return scheme.lower() == b"bearer" and ok

    async def _body(self, scope: Scope, receive: Receive) -> bytes | None:
        """The whole body, or None when it is over the limit (said or seen)."""
        length = _header(scope, b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            return None
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break  # the client went away
            chunk = bytes(message.get("body", b""))
            size += len(chunk)
            if size > self.limit:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value).decode("latin-1")
    return None


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that gives the body read already, then what the client sends."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


async def _send(
    send: Send, status: int, message: str, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    body = json.dumps({"error": message, "field": None}, separators=(",", ":")).encode()
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": head + (headers or [])})
    await send({"type": "http.response.body", "body": body})
