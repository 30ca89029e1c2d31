#!/usr/bin/env bash
# Runs the browser tests of the inspector page (inspector.test.mjs) with node's test runner and
# ends with "N passed, N failed" for tests/run.sh. ATTND_BIN (default build/attnd) and CHROMIUM
# (default /usr/bin/chromium) are passed through; `make browser-deps` installs node_modules.
set -u
here=$(cd "$(dirname "$0")" && pwd)
if [ ! -d "$here/node_modules/playwright-core" ]; then
    echo "tests/browser/node_modules is missing: run 'make browser-deps' (npm ci)"
    echo "0 passed, 1 failed"
    exit 1
fi
if [ ! -x "${CHROMIUM:-/usr/bin/chromium}" ]; then
    echo "${CHROMIUM:-/usr/bin/chromium} is missing: run 'make deps' (Debian's chromium)"
    echo "0 passed, 1 failed"
    exit 1
fi
tap=$(mktemp)
trap 'rm -f "$tap"' EXIT
node --test --test-reporter=spec --test-reporter-destination=stdout \
    --test-reporter=tap --test-reporter-destination="$tap" "$here/inspector.test.mjs"
rc=$?
passed=$(sed -n 's/^# pass \([0-9]*\)$/\1/p' "$tap" | tail -n 1)
failed=$(sed -n 's/^# fail \([0-9]*\)$/\1/p' "$tap" | tail -n 1)
passed=${passed:-0}
failed=${failed:-0}
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then
    failed=1 # the runner itself failed (a crash, a hook that threw)
fi
echo "$passed passed, $failed failed"
exit "$rc"
