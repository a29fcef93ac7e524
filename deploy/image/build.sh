#!/usr/bin/env bash
# The meridian OCI image, without any container registry: a Debian 12 root file system
# made by mmdebstrap from Debian's packages, meridian and its Python dependencies
# installed into a venv in it from a wheelhouse built here, imported into podman's
# store as one layer. `make image` runs it (as root: mmdebstrap's root mode and
# rootful podman); the Makefile decides when (its stamp depends on this script,
# pyproject.toml, src/ and the BPF objects).
#
#   deploy/image/build.sh PYTHON WORKDIR TAG
#
# PYTHON: a Python with pip on this host (the project's venv), which builds the wheel
# (deploy/wheel.sh, as `make wheel`) and fetches the dependencies; WORKDIR: build/image;
# TAG: localhost/meridian:VERSION.
set -euo pipefail

PY=$1
WORK=$2
TAG=$3
ROOT=$(cd "$(dirname "$0")/../.." && pwd)

SUITE=bookworm
# bookworm's python3 and glibc: the wheels are chosen for the image's interpreter and
# C library, not for whatever Python builds them (the dev venv may be another 3.x).
PYVER=3.11
GLIBC_MINOR=36
MACHINE=$(uname -m)
# Every extra but `clickhouse`: chDB is 530 MB and only the embedded store needs it; a
# ClickHouse server is reached over HTTP with the standard library (sentinel's
# --clickhouse-url), so the image stores to a server and queries it, no chDB.
EXTRAS=prometheus,otlp,tui,json,sentinel,api
# What meridian needs from Debian: python3 (the interpreter; the venv is made with
# --without-pip, so no python3-venv), libbpf1 (loaded with ctypes, libbpf.so.1; it
# brings libelf1 and zlib), mount (tracefs and securityfs are mounted when absent),
# zstd (syscalls -w recordings), ca-certificates (OTLP and ClickHouse over HTTPS).
DEBS=python3,libbpf1,mount,zstd,ca-certificates
MIRRORS=(
  "deb http://deb.debian.org/debian $SUITE main"
  "deb http://deb.debian.org/debian $SUITE-updates main"
  "deb http://deb.debian.org/debian-security $SUITE-security main"
)

test "$(id -u)" = 0 || { echo "error: make image needs root (mmdebstrap --mode=root, rootful podman)" >&2; exit 2; }
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
WHEELS=$WORK/wheelhouse
TAR=$WORK/rootfs.tar
trap 'rm -rf "$WHEELS" "$TAR"' EXIT

# 1. The wheel, by the script `make wheel` runs: it refuses one without every BPF
#    object (exit 2, make bpf). They go in as package data; they are CO-RE, so the
#    ones built against this kernel's BTF load on other kernels.
rm -rf "$WHEELS"
WHEEL=$("$ROOT/deploy/wheel.sh" "$PY" "$WHEELS")

# 2. The dependencies as binary wheels for the image's Python and glibc, and pip
#    itself to install them (run from its wheel: the image keeps no pip). Fetched
#    from PyPI here, on the host (pip's cache makes a rebuild's fetch local), so the
#    root file system is installed offline: no network and no index in the chroot.
#    pip takes a manylinux tag literally, so every glibc the image's 2.36 runs is named.
PLATFORMS=()
for minor in $(seq "$GLIBC_MINOR" -1 5); do PLATFORMS+=(--platform "manylinux_2_${minor}_$MACHINE"); done
"$PY" -m pip download -q --only-binary=:all: -d "$WHEELS" \
  --python-version "$PYVER" --implementation cp "${PLATFORMS[@]}" \
  "$WHEEL[$EXTRAS]" pip

PIP=$(cd "$WHEELS" && ls -v pip-*.whl | tail -n 1)

# 3. The root file system. Variant essential: dpkg and the Essential:yes set, no apt
#    (nothing installs packages in a running agent), plus DEBS. No documentation, man
#    pages or translations (dpkg never unpacks them; the copyright files stay).
#    The customize hooks check that the image's Python is the one the wheels are
#    for, install meridian offline into /opt/meridian, check that it starts and
#    finds libbpf.so.1, then remove what only this build needed and what
#    ties the image to this host (its resolv.conf and hostname: podman mounts its own).
#    The merged-usr hooks make / merged (bin -> usr/bin ...) as debootstrap does and
#    install usr-is-merged; else init-system-helpers' `usrmerge | usr-is-merged`
#    brings usrmerge and 47 MB of Perl to do the same conversion.
rm -f "$TAR"
mmdebstrap --quiet --mode=root --variant=essential --include="$DEBS" \
  --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
  --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/info/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --dpkgopt='path-exclude=/usr/share/lintian/*' \
  --customize-hook="chroot \"\$1\" python3 -c 'import sys; v = \"%d.%d\" % sys.version_info[:2]; \
      sys.exit(None if v == \"$PYVER\" else f\"the image has Python {v}, PYVER is $PYVER\")'" \
  --customize-hook="copy-in $WHEELS /tmp" \
  --customize-hook='chroot "$1" python3 -m venv --without-pip /opt/meridian' \
  --customize-hook="chroot \"\$1\" sh -c 'cd /tmp/wheelhouse && /opt/meridian/bin/python $PIP/pip \
      install -q --no-index --no-cache-dir --find-links . \"$(basename "$WHEEL")[$EXTRAS]\"'" \
  --customize-hook='chroot "$1" /opt/meridian/bin/meridian --version' \
  --customize-hook='chroot "$1" /opt/meridian/bin/python -c "from meridian.bpf import _libbpf; _libbpf._load()"' \
  --customize-hook='rm -rf "$1/tmp/wheelhouse" "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* \
      "$1"/var/cache/debconf/*-old "$1"/var/lib/dpkg/*-old "$1"/var/log/* \
      "$1/etc/hostname" && : > "$1/etc/resolv.conf"' \
  "$SUITE" "$TAR" "${MIRRORS[@]}"

# 4. The image: the tar as its one layer. The entrypoint is the CLI; with no command
#    it runs `doctor`, which says what the kernel it landed on allows. The image the
#    tag named before is removed (unless a container still uses it): a rebuild does
#    not leave 250 MB behind each time.
VERSION=${TAG##*:}
OLD=$(podman image inspect --format '{{.Id}}' "$TAG" 2>/dev/null || true)
podman import -q \
  --change 'ENTRYPOINT ["/opt/meridian/bin/meridian"]' \
  --change 'CMD ["doctor"]' \
  --change 'ENV PATH=/opt/meridian/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change "LABEL org.opencontainers.image.title=meridian" \
  --change "LABEL org.opencontainers.image.version=$VERSION" \
  --change "LABEL org.opencontainers.image.revision=$(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo unknown)" \
  "$TAR" "$TAG" >/dev/null
if [ -n "$OLD" ] && [ "$OLD" != "$(podman image inspect --format '{{.Id}}' "$TAG")" ]; then
  podman rmi "$OLD" >/dev/null 2>&1 || true
fi
podman image ls --format '{{.Repository}}:{{.Tag}} {{.ID}} {{.Size}}' "$TAG"
