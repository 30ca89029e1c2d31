#!/usr/bin/env bash
# Validates everything under deploy/ offline: Kubernetes objects against the Kubernetes OpenAPI
# schemas (strict: unknown fields fail), the kustomize base and overlays as rendered by
# `kubectl kustomize`, KServe's kinds against tests/deploy/schemas, the Compose file against the
# Compose specification, nginx.conf, and the cross-file rules (see validate.mjs). Ends with
# "N passed, N failed" and exits non-zero on a failure.
#
#   tests/deploy/check_manifests.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/deploy/node_env.sh
. "$here/node_env.sh"
if ! msg=$(deploy_node_ready); then
    echo "FAIL deploy checks cannot run: $msg"
    echo "0 passed, 1 failed"
    exit 1
fi
[ -n "$msg" ] && echo "$msg"
exec node "$here/validate.mjs"
