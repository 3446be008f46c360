#!/usr/bin/env bash
# Regenerates every generated page of docs/ (and validation/bands.json), in one command:
#   scripts/docs.sh            all of them (about 15 minutes on 2 cores: the executor's and the
#                              planner's timings and the validation fit)
#   scripts/docs.sh NAME…      only these: validation, planner, executor, whatif
# Timings depend on the machine; each page says which one it ran on. Run it on an idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
pages=("$@")
[ ${#pages[@]} -gt 0 ] || pages=(validation planner executor whatif)
for page in "${pages[@]}"; do
  echo "== docs/$page.md"
  case "$page" in
    validation) bash validation/regenerate.sh ;;
    planner) bash scripts/planner-docs.sh ;;
    executor) bash scripts/executor-docs.sh ;;
    whatif) bash scripts/whatif-docs.sh ;;
    *) echo "unknown page '$page': use validation, planner, executor or whatif" >&2; exit 2 ;;
  esac
done
