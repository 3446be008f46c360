#!/usr/bin/env bash
# Regenerates docs/validation.md and validation/bands.json from validation/published-runs.json.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo run --release --quiet -- validate validation/published-runs.json \
    --docs docs/validation.md --bands validation/bands.json > /dev/null
echo "wrote docs/validation.md and validation/bands.json"
