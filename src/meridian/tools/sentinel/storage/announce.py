"""How a query finds the agent that holds a store: the agent writes its API's URL in a
file beside the store's lock while it serves (chDB opens a store in one process only),
and removes it when it stops."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["API_FILE", "agent_url", "announce"]

API_FILE = ".meridian-sentinel.api"  # in the store's directory: the holder's API URL


def announce(store: Path, host: str, port: int) -> Path:
    """Write the API URL of this agent into its store; returns the file to remove."""
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"  # every address: the loopback one answers too
    host = f"[{host}]" if ":" in host else host
    store.mkdir(parents=True, exist_ok=True)
    path = store / API_FILE
    tmp = path.with_suffix(f".{os.getpid()}")
    tmp.write_text(f"http://{host}:{port}\n")
    tmp.replace(path)
    return path


def agent_url(store: Path) -> str | None:
    """The URL an agent holding `store` announced, None when it serves no API."""
    try:
        return (store / API_FILE).read_text().strip() or None
    except OSError:
        return None
