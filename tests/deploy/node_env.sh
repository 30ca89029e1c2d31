# shellcheck shell=bash
# node_env.sh - sourced by the deploy checks: makes sure Node.js is there and that
# tests/deploy/node_modules matches package-lock.json (npm ci, from the npm registry, when it is
# missing or older than the lock file). Returns non-zero with a message on stdout otherwise.
deploy_node_ready() {
    local dir
    dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
    if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
        echo "node and npm are needed (Node.js >= 20; Debian: apt-get install nodejs npm)"
        return 1
    fi
    if [ ! -f "$dir/node_modules/.package-lock.json" ] ||
        [ "$dir/package-lock.json" -nt "$dir/node_modules/.package-lock.json" ]; then
        echo "installing the deploy checks' npm packages (npm ci in tests/deploy)"
        if ! (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >/dev/null); then
            echo "npm ci failed in tests/deploy"
            return 1
        fi
    fi
}
