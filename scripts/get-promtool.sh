#!/usr/bin/env bash
# Puts Prometheus' promtool, from Debian's `prometheus` package at exactly the version
# given, at the path given (make promtool: .venv/bin/promtool). The package itself is never
# installed (it would start a Prometheus daemon): `apt-get download` fetches the .deb,
# which apt checks against the signed package index, into a temporary directory, and only
# usr/bin/promtool is taken out of it. Does nothing when that version is already there.
set -euo pipefail
target="$1"
version="$2"
if [ -x "$target" ] && "$target" --version 2>&1 | grep -qF "revision: $version)"; then
  exit 0
fi
if ! command -v apt-get >/dev/null || ! command -v dpkg-deb >/dev/null; then
  echo "promtool: apt-get and dpkg-deb are missing: the alert rules are checked with" \
    "the promtool of Debian bookworm's prometheus package ($version), which only they" \
    "can fetch (install apt and dpkg, or run on Debian bookworm)" >&2
  exit 1
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "promtool: fetching Debian's prometheus=$version for its promtool (not installing it)"
download() { (cd "$work" && apt-get download -q "prometheus=$version" >/dev/null 2>"$work/apt.log"); }
# A fresh machine may have no package lists yet: fetch them once, as root (CI is).
if ! download && [ "$(id -u)" = 0 ]; then
  apt-get update -qq >/dev/null 2>&1 || true
  download || true
fi
if ! ls "$work"/prometheus_*.deb >/dev/null 2>&1; then
  cat "$work/apt.log" >&2
  echo "promtool: apt-get could not download prometheus=$version (is this Debian" \
    "bookworm, and has \`apt-get update\` run?)" >&2
  exit 1
fi
dpkg-deb --fsys-tarfile "$work"/prometheus_*.deb | tar -x -C "$work" ./usr/bin/promtool
"$work/usr/bin/promtool" --version 2>&1 | grep -qF "revision: $version)"
mkdir -p "$(dirname "$target")"
install -m 0755 "$work/usr/bin/promtool" "$target.$$"
mv -f "$target.$$" "$target"
echo "promtool: $("$target" --version 2>&1 | head -1) at $target"
