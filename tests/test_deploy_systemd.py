"""deploy/systemd, read: the units of the exporters (meridian io, meridian biolat) and of
the sentinel agent, and the agent's example configuration.

- `systemd-analyze verify` accepts each unit and says nothing (a misspelt key or value
  is only a warning to it: any output fails), with the installed command
  /opt/meridian/bin/meridian replaced by this checkout's; `systemd-analyze security`
  counts the refused calls and the other hardening as met;
- each ExecStart line is flags the real `meridian` parser accepts, for a process that
  runs until stopped and serves metrics; sentinel.yaml loads with the agent's own
  configuration loader, and its spool lies in the unit's StateDirectory=;
- each unit is hardened, with only the capabilities its tool was found to need.

These read the files only; test_deploy_systemd_run.py runs the units' processes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from systemd_units import (
    BIOLAT,
    CAPS,
    DEPLOY,
    IO,
    SENTINEL,
    UNITS,
    replace_flag,
    unit,
    with_exec_start,
)
from unit_sandbox import KNOWN, caps, state_dirs, syscall_filter

from meridian.cli import build_parser
from meridian.export.prometheus import parse_listen

INSTALLED = "/opt/meridian/bin/meridian"


def parsed(argv: list[str]) -> argparse.Namespace:
    """argv as `meridian` parses it: a flag it does not know is SystemExit(2) here."""
    return build_parser().parse_args(argv)


def checkout_copy(name: str, tmp_path: Path) -> Path:
    """The unit file with this checkout's meridian in place of the installed one, for
    systemd-analyze (which wants the command to exist)."""
    text = (DEPLOY / f"{name}.service").read_text()
    argv = unit(name).exec_start()
    assert argv[0] == INSTALLED
    # verify wants the command to exist: this checkout's meridian (its venv's script),
    # or, without one, an executable that stands in for it
    here = Path(sys.executable).with_name("meridian")
    if not os.access(here, os.X_OK):
        here = tmp_path / "meridian"
        here.write_text("#!/bin/sh\nexit 0\n")
        here.chmod(0o755)
    copy = tmp_path / f"{name}.service"
    copy.write_text(with_exec_start(text, [str(here), *argv[1:]]))
    return copy


@pytest.mark.parametrize("name", UNITS)
def test_systemd_analyze_verify_accepts_the_unit_silently(name: str, tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (Debian's systemd package)")
    copy = checkout_copy(name, tmp_path)
    got = subprocess.run([analyze, "verify", str(copy)], capture_output=True, text=True)
    assert got.returncode == 0 and got.stdout + got.stderr == "", got.stdout + got.stderr


@pytest.mark.parametrize("name", UNITS)
def test_systemd_analyze_security_finds_calls_refused_and_files_private(
    name: str, tmp_path: Path
) -> None:
    """systemd's own reading of the filter: the groups a service should not reach are
    outside the allow list, and the other settings count as met."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (Debian's systemd package)")
    copy = checkout_copy(name, tmp_path)
    got = subprocess.run([analyze, "security", "--offline=true", "--no-pager", str(copy)],
                         capture_output=True, text=True)  # fmt: skip
    # a setting met is marked with a check mark, or + where the locale is not UTF-8
    met = {line.split()[1] for line in got.stdout.splitlines() if line[:2] in ("\u2713 ", "+ ")}
    refused = ["clock", "cpu-emulation", "module", "mount", "obsolete", "raw-io", "reboot", "swap"]
    want = {f"SystemCallFilter=~@{group}" for group in refused}
    want |= {"RestrictSUIDSGID=", "RestrictRealtime=", "UMask=", "SystemCallArchitectures="}
    assert want <= met, got.stdout + got.stderr


def test_verify_speaks_up_about_a_bad_option(tmp_path: Path) -> None:
    """The check above can fail: a misspelt value is a warning with exit code 0."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (Debian's systemd package)")
    copy = tmp_path / "bad.service"
    copy.write_text(f"[Service]\nExecStart={sys.executable} -V\nProtectSystem=stricter\n")
    got = subprocess.run([analyze, "verify", str(copy)], capture_output=True, text=True)
    assert got.returncode == 0 and "ProtectSystem" not in got.stdout
    assert "stricter" in got.stderr


def test_exec_start_lines_are_flags_meridian_accepts() -> None:
    io = parsed(unit(IO).exec_start()[1:])
    assert io.tool == "io" and io.no_events and not io.top and io.duration is None
    biolat = parsed(unit(BIOLAT).exec_start()[1:])
    assert biolat.tool == "biolat" and biolat.interval is None and biolat.count is None
    assert biolat.duration is None
    sentinel = parsed(unit(SENTINEL).exec_start()[1:])
    assert sentinel.tool == "sentinel" and sentinel.command is None
    assert sentinel.config == "/etc/meridian/sentinel.yaml" and sentinel.duration is None
    # every address, a port each: the three run side by side on a host
    listen = [parse_listen(t.prometheus) for t in (io, biolat, sentinel)]
    assert [host for host, _ in listen] == ["0.0.0.0"] * 3
    assert {port for _, port in listen} == {9435, 9436, 9102}


def test_the_sentinel_example_config_loads_with_the_api_off_and_its_spool_kept() -> None:
    from meridian.tools.sentinel.cli import config_from_args
    from meridian.tools.sentinel.storage.factory import spool_dir_for

    argv = replace_flag(unit(SENTINEL).exec_start()[1:], "--config", str(DEPLOY / "sentinel.yaml"))
    cfg = config_from_args(parsed(argv))
    assert cfg.clickhouse.enabled and cfg.clickhouse.url.startswith("http://")
    assert cfg.clickhouse.password_file.startswith("/etc/meridian/")
    assert not cfg.control_plane.enabled
    assert (cfg.metrics.enabled, cfg.metrics.listen_address) == (True, "0.0.0.0")
    assert cfg.metrics.listen_port == 9102
    assert cfg.run.duration is None and not cfg.mock.enabled
    (state,) = state_dirs(unit(SENTINEL))
    assert spool_dir_for(cfg.clickhouse).parent == state


@pytest.mark.parametrize("name", UNITS)
def test_the_unit_is_hardened_with_only_the_capabilities_found_needed(name: str) -> None:
    u = unit(name)
    assert set(u.sections) == {"Unit", "Service", "Install"}
    assert set(u.sections["Service"]) <= KNOWN  # the kernel tests cover every option
    assert set(caps(u)) == CAPS[name]
    known = subprocess.run(["setpriv", "--list-caps"], capture_output=True, text=True, check=True)
    assert set(caps(u)) <= set(known.stdout.split())
    assert u.values("AmbientCapabilities") == []  # root's uid: the bounding set is all
    for key in ("NoNewPrivileges", "PrivateTmp", "PrivateDevices", "ProtectKernelModules",
                "ProtectControlGroups", "ProtectClock", "ProtectHostname", "RestrictNamespaces",
                "LockPersonality", "MemoryDenyWriteExecute"):  # fmt: skip
        assert u.flag(key), key
    assert u.value("ProtectSystem") == "strict" and u.value("ProtectHome") == "read-only"
    assert u.value("SystemCallArchitectures") == "native"
    # a system service's calls and BPF's, any other refused (not killed); no set-uid
    # files, no realtime scheduling, files for root only
    assert u.values("SystemCallFilter") == ["@system-service bpf perf_event_open"]
    assert u.value("SystemCallErrorNumber") == "EPERM"
    assert u.flag("RestrictSUIDSGID") and u.flag("RestrictRealtime")
    assert u.value("UMask") == "0077"
    assert u.value("LimitMEMLOCK") == "infinity"
    assert (u.value("Restart"), u.value("Type")) == ("on-failure", "exec")
    assert u.value("WantedBy", "Install") == "multi-user.target"
    families = set(u.words("RestrictAddressFamilies"))
    assert {"AF_INET", "AF_INET6", "AF_UNIX"} <= families <= {"AF_INET", "AF_INET6", "AF_UNIX",
                                                              "AF_NETLINK"}  # fmt: skip
    if name == SENTINEL:
        # ProtectKernelTunables= hides /proc/kallsyms, ProtectKernelLogs= drops
        # CAP_SYSLOG: what they would protect otherwise, read-only or refused
        assert not u.flag("ProtectKernelTunables") and not u.flag("ProtectKernelLogs")
        assert {"/sys", "/proc/sys"} <= {p.lstrip("-") for p in u.words("ReadOnlyPaths")}
        assert u.words("InaccessiblePaths") == ["/proc/kmsg"]
        allowed = syscall_filter(u)
        assert allowed is not None and allowed[0] and "syslog" not in allowed[1]
        assert u.words("StateDirectory") == ["meridian/sentinel"]
    else:
        assert u.flag("ProtectKernelTunables") and u.flag("ProtectKernelLogs")
    # errors reach the journal (StandardError= follows StandardOutput= unless given)
    assert (u.value("StandardError") or u.value("StandardOutput") or "journal") == "journal"
