#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment, keyed by the pinned requirements, and install the package.
#   scripts/bootstrap.sh VENV REQUIREMENTS
# VENV is $(CACHE)/venv-<key> from the Makefile, whose CACHE is the one cache root of sglang_prorsa/srt/common/paths.py
# ($SGLANG_PRORSA_CACHE, else ~/.cache/sglang-prorsa); this script defines no path of its own.
# The venv lives in a cache outside the clone so CI runs and later sessions reuse it; a half-built one (no stamp)
# is removed and rebuilt. System packages Mooncake needs over TCP (libibverbs) are installed when missing.
set -euo pipefail
venv=$1
req=$2
stamp="$venv/.prorsa-ready"
root=$(cd "$(dirname "$0")/.." && pwd)

log() { echo "[bootstrap] $*" >&2; }

need_pkgs=()
for p in libibverbs1 ibverbs-providers; do
  dpkg -s "$p" >/dev/null 2>&1 || need_pkgs+=("$p")
done
if [ ${#need_pkgs[@]} -gt 0 ]; then
  log "installing system packages: ${need_pkgs[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi

if [ ! -f "$stamp" ]; then
  if [ -d "$venv" ]; then
    log "removing an unfinished environment at $venv"
    rm -rf "$venv"
  fi
  start=$(date +%s)
  log "creating $venv from $req (sglang and its dependencies: ~11 GB, several minutes on first use)"
  mkdir -p "$(dirname "$venv")"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
  "$venv/bin/pip" install --progress-bar on -r "$req"
  end=$(date +%s)
  log "environment ready in $((end - start)) s ($(du -sh "$venv" | cut -f1))"
  touch "$stamp"
fi

# Development tools (ruff, mypy): into the same environment, again whenever requirements/dev.txt changes.
tools_stamp="$venv/.prorsa-dev-$(sha256sum "$root/requirements/dev.txt" | cut -c1-12)"
if [ ! -f "$tools_stamp" ]; then
  log "installing development tools from requirements/dev.txt"
  "$venv/bin/pip" install -q -r "$root/requirements/dev.txt"
  rm -f "$venv"/.prorsa-dev-*
  touch "$tools_stamp"
fi

# The package itself: editable, no dependency resolution (the requirements already pin them). Redone only when
# setup.py changes.
dev_stamp="$venv/.prorsa-develop-$(sha256sum "$root/setup.py" | cut -c1-12)-$(echo "$root" | sha256sum | cut -c1-8)"
if [ ! -f "$dev_stamp" ]; then
  log "installing sglang_prorsa (editable) from $root"
  "$venv/bin/pip" install -q --no-deps --no-build-isolation -e "$root"
  rm -f "$venv"/.prorsa-develop-*
  touch "$dev_stamp"
fi
