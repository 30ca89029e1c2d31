#!/usr/bin/env bash
# Runs the deployment's contract against a real attnd (build/attnd, on ephemeral ports of
# 127.0.0.1 via --port 0 --port-file):
# - every configuration deploy/ defines (the kustomize base and overlays' ConfigMaps, the
#   Compose replicas' environment, the KServe runtime's env and args; image.mjs configs) starts,
#   turns ready, shows its --max-queue and --max-memory-bytes in /metrics, and exits 0 on
#   SIGTERM: the values parse, lie within bounds and take effect;
# - tests/deploy/shard_client proves that key shards merged by LSE equal the unsharded answer
#   (the scale-out recipe of deploy/README.md);
# - /metrics serves the series the prometheus-adapter rule turns into the HPA's
#   attnd_queue_seconds (attnd_request_stage_seconds_{sum,count}{stage="queue"}), and the probe
#   routes of the manifests answer 200;
# - `attnd --healthcheck` (the image's HEALTHCHECK) exits 0 against it, 1 against nothing, once
#   --help lists the mode;
# - SIGTERM ends it with exit status 0, as Kubernetes' and Docker's stop do.
# Ends with "N passed, N failed[, N skipped]"; exits non-zero on a failure.
#
#   tests/deploy/check_live.sh [path/to/attnd [path/to/shard_client]]
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=${1:-${ATTND_BIN:-$root/build/attnd}}
client=${2:-$root/build/tests/deploy/shard_client}

. "$root/tests/support/check.sh"

if [ ! -x "$bin" ]; then
    skip "live checks: $bin is not built yet"
    finish
fi
if [ ! -x "$client" ]; then
    fail "live checks: $client is not built (make $client)"
    finish
fi

tmp=$(mktemp -d)
pid=""
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        kill -KILL "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT

# The caller's ATTND_* variables (ATTND_BIN, say) must not leak into the daemons; anything else
# (OPENBLAS_CORETYPE on some processors) must stay.
clean_env=(env)
for v in $(compgen -e | grep '^ATTND_'); do clean_env+=(-u "$v"); done

# attnd's size syntax (K/M/G/T binary, optional iB or B) in bytes.
attnd_size() {
    awk -v s="$1" 'BEGIN {
        if (!match(s, /^[0-9]+/)) { print -1; exit }
        n = substr(s, 1, RLENGTH) + 0; u = toupper(substr(s, RLENGTH + 1, 1))
        m = (u == "K") ? 2^10 : (u == "M") ? 2^20 : (u == "G") ? 2^30 : (u == "T") ? 2^40 : 1
        printf "%.0f", n * m }'
}

# Files a configuration names (certificate, key, token file) come from Secrets on a cluster;
# here stand-ins made for the check take their place, under the same variables.
live_token=live-check-token-0123456789
printf '%s\n' "$live_token" >"$tmp/tokens"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=attnd \
    -addext subjectAltName=IP:127.0.0.1 -addext extendedKeyUsage=serverAuth,clientAuth \
    -keyout "$tmp/tls.key" -out "$tmp/tls.crt" >/dev/null 2>&1 || : >"$tmp/tls.crt"
# Rewrites cfg_env in place and sets scheme and curl_opts for the checks of that daemon.
stand_in_files() {
    local i
    scheme=http
    curl_opts=()
    for i in "${!cfg_env[@]}"; do
        case "${cfg_env[$i]%%=*}" in
        ATTND_TLS_CERT) cfg_env[i]="ATTND_TLS_CERT=$tmp/tls.crt" scheme=https
            curl_opts+=(--cacert "$tmp/tls.crt") ;;
        ATTND_TLS_KEY) cfg_env[i]="ATTND_TLS_KEY=$tmp/tls.key" ;;
        ATTND_TLS_CLIENT_CA) cfg_env[i]="ATTND_TLS_CLIENT_CA=$tmp/tls.crt"
            curl_opts+=(--cert "$tmp/tls.crt" --key "$tmp/tls.key") ;;
        ATTND_AUTH_TOKEN_FILE) cfg_env[i]="ATTND_AUTH_TOKEN_FILE=$tmp/tokens"
            curl_opts+=(-H "Authorization: Bearer $live_token") ;;
        esac
    done
}

# ---- every configuration of deploy/ -----------------------------------------------------------
if ! command -v node >/dev/null 2>&1; then
    skip "configurations of deploy/: image.mjs needs Node.js"
else
    # shellcheck source=tests/deploy/node_env.sh
    . "$here/node_env.sh"
    deploy_node_ready >/dev/null || true
    while IFS=$'\t' read -r -a words; do
        name=${words[0]}
        cfg_env=()
        cfg_args=()
        for w in "${words[@]:1}"; do
            case "$w" in
            --*) cfg_args+=("$w") ;;
            *) cfg_env+=("$w") ;;
            esac
        done
        stand_in_files
        rm -f "$tmp/cport"
        # The configuration's own flags first: the test's --host and ports come later and win
        # (an --admin-port of the configuration becomes an ephemeral one, too).
        "${clean_env[@]}" "${cfg_env[@]}" "$bin" "${cfg_args[@]}" --host 127.0.0.1 --port 0 \
            --admin-port 0 --port-file "$tmp/cport" >"$tmp/cout" 2>"$tmp/cerr" &
        cpid=$!
        for _ in $(seq 100); do
            [ -s "$tmp/cport" ] && break
            kill -0 "$cpid" 2>/dev/null || break
            sleep 0.1
        done
        if [ ! -s "$tmp/cport" ]; then
            kill -KILL "$cpid" 2>/dev/null
            wait "$cpid" 2>/dev/null
            fail "config $name: attnd did not start: $(tail -c 300 "$tmp/cerr" | tr '\n' ' ')"
            continue
        fi
        cport=$(tr -d '[:space:]' <"$tmp/cport")
        problems=""
        code=000
        for _ in $(seq 50); do
            code=$(curl -s "${curl_opts[@]}" -o /dev/null -w '%{http_code}' "$scheme://127.0.0.1:$cport/v2/health/ready")
            [ "$code" = 200 ] && break
            sleep 0.1
        done
        [ "$code" = 200 ] || problems="$problems /v2/health/ready answers $code."
        curl -s "${curl_opts[@]}" "$scheme://127.0.0.1:$cport/metrics" >"$tmp/cmetrics"
        for kv in "${cfg_env[@]}"; do
            case "${kv%%=*}" in
            ATTND_MAX_QUEUE) series=attnd_max_queue want=${kv#*=} ;;
            ATTND_MAX_MEMORY_BYTES) series=attnd_memory_budget_bytes want=$(attnd_size "${kv#*=}") ;;
            *) continue ;;
            esac
            got=$(awk -v s="$series" '$1 == s { printf "%.0f", $2 }' "$tmp/cmetrics")
            [ "$got" = "$want" ] || problems="$problems $series is ${got:-absent}, not $want (${kv})."
        done
        kill -TERM "$cpid"
        status=""
        for _ in $(seq 100); do
            if ! kill -0 "$cpid" 2>/dev/null; then
                wait "$cpid"
                status=$?
                break
            fi
            sleep 0.1
        done
        if [ -z "$status" ]; then
            kill -KILL "$cpid" 2>/dev/null
            wait "$cpid" 2>/dev/null
            problems="$problems still running 10 s after SIGTERM."
        elif [ "$status" != 0 ]; then
            problems="$problems exit status $status after SIGTERM."
        fi
        if [ -z "$problems" ]; then
            ok "config $name: attnd starts, is ready, applies it (${#cfg_env[@]} variables${cfg_args[*]:+, ${cfg_args[*]}}) and exits 0 on SIGTERM"
        else
            fail "config $name:$problems"
        fi
    done < <(node "$here/image.mjs" configs)
fi

# ---- the daemon for the checks below --------------------------------------------------------------
"${clean_env[@]}" "$bin" --host 127.0.0.1 --port 0 --port-file "$tmp/port" --threads 2 --drain-timeout-s 5 \
    --log-level warn >"$tmp/stdout" 2>"$tmp/stderr" &
pid=$!
for _ in $(seq 100); do
    [ -s "$tmp/port" ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
done
if [ ! -s "$tmp/port" ]; then
    fail "attnd did not start listening: $(tail -c 400 "$tmp/stderr" | tr '\n' ' ')"
    finish
fi
port=$(tr -d '[:space:]' <"$tmp/port")
url="http://127.0.0.1:$port"

ready=0
for _ in $(seq 50); do
    if [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/v2/health/ready")" = 200 ]; then
        ready=1
        break
    fi
    sleep 0.1
done
if [ "$ready" = 1 ]; then
    ok "attnd on port $port is ready"
else
    fail "attnd on port $port never answered 200 on /v2/health/ready"
    finish
fi

# ---- key shards merged by LSE ------------------------------------------------------------------
"$client" "$url" >"$tmp/client" 2>&1
rc=$?
grep -v -E '^[0-9]+ passed, [0-9]+ failed' "$tmp/client"
line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$tmp/client" | tail -n 1)
if [ -n "$line" ]; then
    p=${line%% passed*}
    f=${line#*passed, }
    f=${f%% failed*}
    passed=$((passed + p))
    failed=$((failed + f))
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        fail "shard_client exited $rc"
    fi
else
    fail "shard_client exited $rc without a summary line"
fi

# ---- what the manifests rely on -----------------------------------------------------------------
for route in /v2/health/live /v2/health/ready /metrics; do
    code=$(curl -s -o "$tmp/body" -w '%{http_code}' "$url$route")
    if [ "$code" = 200 ]; then
        ok "GET $route answers 200 (a probe or scrape path of deploy/)"
    else
        fail "GET $route answers $code"
    fi
done
curl -s "$url/metrics" >"$tmp/metrics"
missing=""
for series in 'attnd_request_stage_seconds_sum{stage="queue"}' \
    'attnd_request_stage_seconds_count{stage="queue"}'; do
    grep -qF "$series" "$tmp/metrics" || missing="$missing $series"
done
if [ -z "$missing" ]; then
    count=$(grep -F 'attnd_request_stage_seconds_count{stage="queue"}' "$tmp/metrics" | awk '{print $2}')
    if awk -v c="$count" 'BEGIN { exit !(c > 0) }'; then
        ok "/metrics serves the queue-stage histogram the HPA's adapter rule reads (count $count)"
    else
        fail "/metrics: the queue-stage histogram counted no request after the shard client's"
    fi
else
    fail "/metrics lacks the series the prometheus-adapter rule reads:$missing"
fi

# ---- the image's HEALTHCHECK --------------------------------------------------------------------
if "$bin" --help 2>&1 | grep -qE '^ *--healthcheck'; then
    if ATTND_PORT=$port timeout 10 "$bin" --healthcheck >/dev/null 2>&1; then
        ok "attnd --healthcheck exits 0 against a ready daemon (ATTND_PORT=$port)"
    else
        fail "attnd --healthcheck did not exit 0 against a ready daemon"
    fi
    if ATTND_PORT=1 timeout 10 "$bin" --healthcheck >/dev/null 2>&1; then
        fail "attnd --healthcheck exits 0 with nothing listening (port 1)"
    else
        ok "attnd --healthcheck exits non-zero with nothing listening"
    fi
    # A container started with `--port N`: its HEALTHCHECK shares the environment (the image's
    # ATTND_PORT=8080 and ATTND_PORT_FILE), not the flag, and follows the port file.
    if ATTND_PORT=1 ATTND_PORT_FILE="$tmp/port" timeout 10 "$bin" --healthcheck >/dev/null 2>&1; then
        ok "attnd --healthcheck follows the port the daemon wrote to ATTND_PORT_FILE, not ATTND_PORT"
    else
        fail "attnd --healthcheck did not follow ATTND_PORT_FILE ($(cat "$tmp/port"))"
    fi
    if ATTND_PORT=$port ATTND_PORT_FILE="$tmp/no-such-file" timeout 10 "$bin" --healthcheck \
        >/dev/null 2>&1; then
        ok "attnd --healthcheck falls back to ATTND_PORT while no port file exists"
    else
        fail "attnd --healthcheck without its port file did not probe ATTND_PORT"
    fi
    # With an admin listener (compose and the cluster set one), the probe asks it, not the
    # serving port: here the serving port it is told (1) has nothing behind it.
    rm -f "$tmp/hport" "$tmp/hadmin"
    "${clean_env[@]}" "$bin" --host 127.0.0.1 --port 0 --port-file "$tmp/hport" --admin-port 0 \
        --admin-port-file "$tmp/hadmin" >"$tmp/hout" 2>&1 &
    hpid=$!
    for _ in $(seq 100); do
        [ -s "$tmp/hadmin" ] && break
        sleep 0.1
    done
    if ATTND_PORT=1 ATTND_ADMIN_PORT=0 ATTND_ADMIN_PORT_FILE="$tmp/hadmin" timeout 10 "$bin" \
        --healthcheck >/dev/null 2>&1; then
        ok "attnd --healthcheck asks the --admin-port listener when one is configured"
    else
        fail "attnd --healthcheck with ATTND_ADMIN_PORT did not probe the admin listener"
    fi
    if ATTND_PORT="$(cat "$tmp/hport")" ATTND_ADMIN_PORT=1 timeout 10 "$bin" --healthcheck \
        >/dev/null 2>&1; then
        fail "attnd --healthcheck probed the serving port although ATTND_ADMIN_PORT names another"
    else
        ok "attnd --healthcheck probes the configured admin port, not the serving one"
    fi
    kill "$hpid" 2>/dev/null
    wait "$hpid" 2>/dev/null
else
    skip "attnd --healthcheck: not in --help yet (the server must add it for the image's HEALTHCHECK)"
fi

# ---- SIGTERM --------------------------------------------------------------------------------------
kill -TERM "$pid"
status=""
for _ in $(seq 150); do
    if ! kill -0 "$pid" 2>/dev/null; then
        wait "$pid"
        status=$?
        break
    fi
    sleep 0.1
done
if [ "$status" = 0 ]; then
    ok "SIGTERM: attnd drains and exits 0 (what Kubernetes and docker stop send)"
elif [ -z "$status" ]; then
    fail "SIGTERM: attnd still running 15 s later (--drain-timeout-s 5)"
else
    fail "SIGTERM: attnd exited $status"
fi
pid=""
finish
