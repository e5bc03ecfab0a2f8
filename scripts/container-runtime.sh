#!/usr/bin/env bash
# A real container runtime for the pod tests (make container-runtime; tests/deploy/): Debian's
# docker.io, its daemon on a private socket, and an offline base image to build the
# project's image on (no registry answers here, so nothing can be pulled).
#
# Everything lives in a cache outside the checkout (ATELIER_DOCKER_DIR, default
# /var/cache/atelier-docker): the daemon's data root keeps the base image and the image's
# layers, so clean clones and later runs reuse them. The daemon is left running for the next
# run; `scripts/container-runtime.sh stop` stops it.
#
# As root on Debian: installs docker.io and debootstrap when missing, starts dockerd, and
# builds the base once (debootstrap minbase + python3, with this machine's extra CA
# certificates so pip inside a build trusts the same TLS proxy the machine does). Elsewhere
# it says why it cannot and how to enable it, and exits 0: the pod tests then skip, saying so.
set -euo pipefail

dir="${ATELIER_DOCKER_DIR:-/var/cache/atelier-docker}"
base="${ATELIER_BASE_IMAGE:-atelier-base:bookworm}"
socket="$dir/docker.sock"
# The exec root holds containerd's sockets: a short path (unix socket paths are limited).
exec_root="/run/atelier-docker"
export DOCKER_HOST="unix://$socket"

cannot() {
  echo "container runtime: $1; the pod tests (tests/deploy/) will skip." >&2
  echo "container runtime: to enable them, run \`make container-runtime\` as root on Debian" \
    "bookworm (it installs docker.io and debootstrap), or point ATELIER_DOCKER_HOST at a" \
    "Docker engine that has an image $base (Debian bookworm with python3 and python3-venv)." >&2
  exit 0
}

answers() { docker info >/dev/null 2>&1; }

if [ "${1:-}" = stop ]; then
  if [ -f "$dir/dockerd.pid" ] && kill -0 "$(cat "$dir/dockerd.pid")" 2>/dev/null; then
    kill "$(cat "$dir/dockerd.pid")"
    echo "container runtime: stopped dockerd ($(cat "$dir/dockerd.pid"))"
  fi
  exit 0
fi

if [ "$(id -u)" != 0 ]; then
  if [ -S "$socket" ] && answers && docker image inspect "$base" >/dev/null 2>&1; then
    exit 0
  fi
  cannot "not root, and no engine with $base answers on $socket"
fi
command -v apt-get >/dev/null || cannot "no apt-get (not Debian)"

mkdir -p "$dir"
# One setup at a time (CI and a developer may start make test together).
exec 9>"$dir/lock"
flock 9

missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v docker >/dev/null || missing+=(docker.io)
if [ "${#missing[@]}" -gt 0 ]; then
  echo "container runtime: installing Debian's ${missing[*]}"
  apt-get -o DPkg::Lock::Timeout=600 update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi

if ! answers; then
  mkdir -p "$exec_root"
  rm -f "$socket"
  echo "container runtime: starting dockerd on $socket (data root $dir/data)"
  # Its own bridge name and no iptables changes: the pod tests use host networking, and
  # the machine's firewall stays as it was.
  setsid nohup dockerd -H "$DOCKER_HOST" --data-root "$dir/data" --exec-root "$exec_root" \
    --pidfile "$dir/dockerd.pid" --iptables=false --bridge=none \
    >"$dir/dockerd.log" 2>&1 </dev/null 9>&- &
  for _ in $(seq 1 120); do
    answers && break
    sleep 0.5
  done
  if ! answers; then
    tail -20 "$dir/dockerd.log" >&2
    echo "container runtime: dockerd did not answer within 60 s (log: $dir/dockerd.log)" >&2
    exit 1
  fi
fi

if ! docker image inspect "$base" >/dev/null 2>&1; then
  rootfs="$dir/rootfs.$$"
  trap 'rm -rf "$rootfs"' EXIT
  mirror="$(sed -n 's/^URIs: *\(http[^ ]*debian\)$/\1/p' /etc/apt/sources.list.d/*.sources \
    /etc/apt/sources.list 2>/dev/null | head -1 || true)"
  echo "container runtime: building the base $base with debootstrap (once; cached in $dir)"
  started=$(date +%s)
  debootstrap --variant=minbase --include=python3,python3-venv,python-is-python3,passwd,ca-certificates \
    bookworm "$rootfs" "${mirror:-http://deb.debian.org/debian}" >"$dir/debootstrap.log" 2>&1 \
    || { tail -20 "$dir/debootstrap.log" >&2; exit 1; }
  # pip inside a build reaches PyPI through whatever TLS proxy this machine trusts.
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$rootfs/usr/local/share/ca-certificates/"
    chroot "$rootfs" update-ca-certificates >/dev/null 2>&1 || true
  fi
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | docker import - "$base" >/dev/null
  echo "container runtime: $base imported in $(($(date +%s) - started)) s"
fi
echo "container runtime: $(docker version --format 'engine {{.Server.Version}}') on $socket, base $base"
