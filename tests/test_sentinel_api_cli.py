"""The control plane from the command line: one-line errors with exit 2, a prompt end
on SIGTERM, and the kernel maps following the API on the real kernel."""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_cli import one_line_exit_2
from test_sentinel_api import PREFIX, call, ok
from test_sentinel_e2e import free_port, mock_config, wait_for

from meridian.tools.sentinel.agent.run import Runtime
from meridian.tools.sentinel.agent.services import Services


def sentinel(*args: str, code: str = "") -> subprocess.CompletedProcess[str]:
    prog = f"import sys\n{code}\nfrom meridian.cli import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", prog, "sentinel", "--perf-mock", "--duration", "5", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_errors(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        one_line_exit_2(sentinel("--api-port", str(busy.getsockname()[1])), "--api-port")
    missing = str(tmp_path / "nope")
    one_line_exit_2(sentinel("--api-port", "0", "--api-token-file", missing), missing)
    one_line_exit_2(sentinel("--api-address", "::1"), "needs --api-port")
    one_line_exit_2(sentinel("--api-port", "70000"), "--api-port: must be from 0 to 65535")
    no_extra = "sys.modules['fastapi'] = None"
    p = sentinel("--api-port", "0", code=no_extra)
    one_line_exit_2(p, "--api-port needs an optional part: pip install 'meridian-ebpf[api]'")


def test_cli_serves_and_sigterm_ends_it_promptly() -> None:
    port = free_port()
    cmd = [sys.executable, "-m", "meridian", "sentinel", "--perf-mock", "--api-port", str(port)]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:

        def up() -> bool:
            try:
                return call(port, "POST", "/mode", {"mode": "diagnostic"}, auth=False)[0] == 200
            except OSError:
                return False

        wait_for(up, timeout=30)
        keep = http.client.HTTPConnection("127.0.0.1", port, timeout=10)  # an idle client
        keep.request("GET", PREFIX + "/status")
        assert keep.getresponse().read()
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=15)
        keep.close()
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 0, err
    assert time.monotonic() - t0 < 5
    assert "samples in" in out  # the summary
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past TIME_WAIT
        s.bind(("127.0.0.1", port))  # nothing listens there any more


# ---- the real kernel ------------------------------------------------------------------


@pytest.mark.kernel
def test_kernel_maps_follow_the_api() -> None:
    from meridian.tools.sentinel.agent.run import make_source

    cfg = mock_config()
    cfg.mock.enabled = False
    cfg.perf.sentinel_groups = [["cpu-clock"]]
    cfg.perf.frequency = 99
    cfg.control_plane.enabled, cfg.control_plane.listen_port = True, free_port()
    port = cfg.control_plane.listen_port
    logged: list[str] = []
    rt = Runtime(cfg, lambda: make_source(cfg, logged.append), log=logged.append)
    services = Services(cfg, rt, logged.append)
    services.start()
    try:
        assert rt.source is not None
        maps = rt.source.obj.maps  # type: ignore[attr-defined]

        def tb() -> tuple[int, int]:
            v = maps["ms_tb_cfg"].lookup(0)
            return int(v["samples_per_sec"]), int(v["hard_drop_ns"])

        bucket = {"sentinel_samples_per_sec": 321, "hard_drop_ns": 4567}
        ok(port, "POST", "/token-bucket", bucket)  # no token configured: none needed
        wait_for(lambda: tb() == (321, 4567), timeout=5)

        def pids() -> tuple[int, list[int]]:
            flag = int(maps["ms_ctrl"].lookup(0)["pid_filter"])
            keys = maps["ms_target_pids"].keys()  # a BPF map's, not a dict's
            return flag, sorted(int(k) for k in keys)

        me = os.getpid()
        ok(port, "POST", "/targets", {"targets": [{"pid": me}, {"pid": 1}]})
        wait_for(lambda: pids() == (1, [1, me]), timeout=5)
        ok(port, "POST", "/targets", {"targets": []})
        wait_for(lambda: pids() == (0, []), timeout=5)
        assert ok(port, "GET", "/status")["source"].startswith("cpu-clock")
    finally:
        services.stop()
    assert not [line for line in logged if "internal error" in line], logged
