#!/usr/bin/env bash
# Run the whole test suite under several pytest-randomly seeds (test order and random state), to
# show it does not depend on the order its tests run in.
#
#   scripts/randomly_seeds.sh                 # seeds 1..20, the whole suite, -n 2
#   SEEDS="7 8" scripts/randomly_seeds.sh     # chosen seeds
#   scripts/randomly_seeds.sh tests/test_sandbox.py -x    # extra pytest arguments (a subset, -x, ...)
#
# PYTHON picks the interpreter (default: python). Prints one line per seed and a summary; exits 1 if
# any seed failed (its log is kept in $LOGS, default a temporary folder).
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
SEEDS=${SEEDS:-$(seq 1 20)}
LOGS=${LOGS:-$(mktemp -d -t retrylab-seeds-XXXXXX)}
failed=()
for seed in $SEEDS; do
    started=$(date +%s)
    if "$PYTHON" -m pytest -p randomly --randomly-seed="$seed" -n 2 -q "$@" \
            >"$LOGS/seed-$seed.log" 2>&1; then
        verdict=passed
    else
        verdict=FAILED
        failed+=("$seed")
    fi
    echo "seed $seed: $verdict in $(( $(date +%s) - started )) s - $(tail -n 1 "$LOGS/seed-$seed.log")"
done
if [ ${#failed[@]} -eq 0 ]; then
    echo "all seeds passed ($SEEDS); logs in $LOGS"
else
    echo "failed seeds: ${failed[*]}; logs in $LOGS" >&2
    exit 1
fi
