#!/usr/bin/env bash
# Installs the test servers that pip alone does not bring. The servers themselves are
# started (on free ports) and stopped by the pytest session fixtures in tests/services/.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== services: nothing extra to install yet"
