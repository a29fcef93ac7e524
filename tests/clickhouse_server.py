"""Debian's clickhouse-server for the sentinel storage tests: started as a child on free
ports of 127.0.0.1, with its config, data and logs under one temporary directory, and
stopped in a finally. Two users: `writer` (what an agent stores as) and `reader`, whose
profile has readonly=1 (no DDL, no setting changed by a query), from users.d as an
administrator adds one."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Generator
from pathlib import Path

import pytest

SERVER = shutil.which("clickhouse-server") or "/usr/sbin/clickhouse-server"
PASSWORD = "s3cret pass"
READER, READER_PASSWORD = "reader", "read only"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class ClickHouseServer:
    """Debian's clickhouse-server as a child of this test, on 127.0.0.1 only, with its
    config, data and logs under one temporary directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.http_port = free_port()
        self.tcp_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        root.mkdir(parents=True, exist_ok=True)
        (root / "config.xml").write_text(
            f"""<?xml version="1.0"?>
<yandex>
  <logger><level>warning</level><console>0</console>
    <log>{root}/server.log</log><errorlog>{root}/server.err.log</errorlog></logger>
  <listen_host>127.0.0.1</listen_host>
  <http_port>{self.http_port}</http_port>
  <tcp_port>{self.tcp_port}</tcp_port>
  <path>{root}/data/</path>
  <tmp_path>{root}/tmp/</tmp_path>
  <user_files_path>{root}/user_files/</user_files_path>
  <format_schema_path>{root}/format_schemas/</format_schema_path>
  <mark_cache_size>16777216</mark_cache_size>
  <max_concurrent_queries>20</max_concurrent_queries>
  <users_config>{root}/users.xml</users_config>
  <default_profile>default</default_profile>
  <default_database>default</default_database>
  <timezone>UTC</timezone>
</yandex>
"""
        )
        (root / "users.xml").write_text(
            f"""<?xml version="1.0"?>
<yandex>
  <profiles><default><max_memory_usage>1000000000</max_memory_usage></default></profiles>
  <users><writer><password>{PASSWORD}</password>
    <networks><ip>127.0.0.1</ip><ip>::1</ip></networks>
    <profile>default</profile><quota>default</quota></writer></users>
  <quotas><default><interval><duration>3600</duration><queries>0</queries>
    <errors>0</errors><result_rows>0</result_rows><read_rows>0</read_rows>
    <execution_time>0</execution_time></interval></default></quotas>
</yandex>
"""
        )
        (root / "users.d").mkdir(exist_ok=True)  # merged into users.xml by the server
        (root / "users.d" / "reader.xml").write_text(
            f"""<?xml version="1.0"?>
<yandex>
  <profiles><readonly><readonly>1</readonly></readonly></profiles>
  <users><{READER}><password>{READER_PASSWORD}</password>
    <networks><ip>127.0.0.1</ip><ip>::1</ip></networks>
    <profile>readonly</profile><quota>default</quota></{READER}></users>
</yandex>
"""
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def start(self) -> None:
        with open(self.root / "stderr.log", "ab") as err:
            self.proc = subprocess.Popen(
                [SERVER, f"--config-file={self.root}/config.xml"],
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log = (self.root / "stderr.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"clickhouse-server exited {self.proc.returncode}: {log}")
            try:
                with urllib.request.urlopen(f"{self.url}/ping", timeout=1) as r:
                    if r.read().strip() == b"Ok.":
                        return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("clickhouse-server did not answer /ping in 60 s")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def running_server(root: Path) -> Generator[ClickHouseServer, None, None]:
    if not os.access(SERVER, os.X_OK):
        pytest.skip("clickhouse-server is not installed (apt-get install clickhouse-server)")
    srv = ClickHouseServer(root)
    try:
        srv.start()
        yield srv
    finally:
        srv.stop()
