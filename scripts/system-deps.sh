#!/usr/bin/env bash
# Installs the system tools carl's sandboxes and tools use (bubblewrap, ripgrep) when they are missing.
set -euo pipefail
missing=()
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
command -v rg >/dev/null 2>&1 || missing+=(ripgrep)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "carl needs: ${missing[*]}. Install them with your package manager (e.g. sudo apt-get install -y ${missing[*]})." >&2
    exit 1
  fi
  echo "installing system packages: ${missing[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
