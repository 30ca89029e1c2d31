#!/usr/bin/env bash
# Runs deploy/compose without Docker: two build/attnd replicas with the Compose file's
# environment (x-attnd-env) and nginx with deploy/compose/nginx.conf, its upstreams and listen
# port moved to free ports on 127.0.0.1 and its temporary paths to a scratch folder. Then:
# - health and attention requests through nginx succeed, and both replicas serve some;
# - tests/deploy/shard_client passes through nginx (bodies and replies cross it unchanged);
# - a body declared one byte over ATTND_MAX_BODY_BYTES gets 413 from nginx at once, and one of
#   exactly that size is passed on (nginx's limit equals attnd's);
# - 20 KV-cache sessions x 50 steps through nginx (X-Session-Key) each match /v1/attention
#   over their history: every step reached the replica holding its session;
# - a replica that stops (SIGTERM) is drained while nginx keeps answering from the other, and
#   its sessions answer 404 session_evicted through nginx while the others step on.
# Skipped when nginx is not installed (Debian: apt-get install nginx; ATTND_NGINX may name a
# binary elsewhere). Ends with "N passed, N failed[, N skipped]".
#
#   tests/deploy/check_compose.sh [path/to/attnd [path/to/shard_client]]
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=${1:-${ATTND_BIN:-$root/build/attnd}}
client=${2:-$root/build/tests/deploy/shard_client}
compose=$root/deploy/compose/docker-compose.yml
conf=$root/deploy/compose/nginx.conf

. "$root/tests/support/check.sh"

nginx=""
for cand in "${ATTND_NGINX:-}" "$(command -v nginx || true)" /usr/sbin/nginx; do
    if [ -n "$cand" ] && [ -x "$cand" ]; then
        nginx=$cand
        break
    fi
done
if [ -z "$nginx" ]; then
    skip "compose without Docker: nginx is not installed (apt-get install nginx, or set ATTND_NGINX)"
    finish
fi
if ! command -v curl >/dev/null; then
    fail "the curl command is missing (make deps-test installs it)"
    finish
fi
if [ ! -x "$bin" ] || [ ! -x "$client" ]; then
    skip "compose without Docker: $bin or $client is not built yet"
    finish
fi

tmp=$(mktemp -d)
pids=()
nginx_pid=""
# Stops the nginx this script started, master and workers: TERM makes the master stop its
# workers before it exits; KILL only where it does not within 5 s.
stop_nginx() {
    if [ -n "$nginx_pid" ] && kill -TERM "$nginx_pid" 2>/dev/null; then
        for _ in $(seq 50); do
            kill -0 "$nginx_pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$nginx_pid" 2>/dev/null
        wait "$nginx_pid" 2>/dev/null
    fi
    nginx_pid=""
}
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
    for p in "${pids[@]}"; do
        kill -KILL "$p" 2>/dev/null && wait "$p" 2>/dev/null
    done
    stop_nginx
    rm -rf "$tmp"
}
trap cleanup EXIT

# The replicas' environment, as the Compose file gives it (x-attnd-env: KEY: value lines).
env_args=()
while IFS= read -r line; do
    key=${line%%:*}
    value=${line#*: }
    value=${value#\"}
    value=${value%\"}
    env_args+=("$key=$value")
done < <(sed -n '/^x-attnd-env:/,/^$/{s/^  \(ATTND_[A-Z0-9_]*: .*\)$/\1/p}' "$compose")
body_limit=""
for kv in "${env_args[@]}"; do
    [ "${kv%%=*}" = ATTND_MAX_BODY_BYTES ] && body_limit=${kv#*=}
done
if [ "${#env_args[@]}" -eq 0 ] || [ -z "$body_limit" ]; then
    fail "cannot read x-attnd-env (with ATTND_MAX_BODY_BYTES) from $compose"
    finish
fi

# Starts replica $1 on ephemeral ports (the serving port ends up in $tmp/port.$1; the admin
# listener the compose file configures moves to one too, as two replicas share this host).
start_replica() {
    env "${env_args[@]}" "$bin" --host 127.0.0.1 --port 0 --port-file "$tmp/port.$1" \
        --admin-port 0 --threads 1 --drain-timeout-s 5 --log-level warn >"$tmp/out.$1" \
        2>"$tmp/err.$1" &
    pids+=($!)
    for _ in $(seq 100); do
        [ -s "$tmp/port.$1" ] && return 0
        sleep 0.1
    done
    return 1
}
if ! start_replica 1 || ! start_replica 2; then
    fail "the replicas did not start: $(cat "$tmp"/err.* | tail -c 400 | tr '\n' ' ')"
    finish
fi
p1=$(tr -d '[:space:]' <"$tmp/port.1")
p2=$(tr -d '[:space:]' <"$tmp/port.2")

# A free port for nginx: bind 0 through the kernel is not possible from bash, so try a few in
# the dynamic range until nginx starts.
mkdir -p "$tmp/logs"
temps=""
for t in client_body proxy fastcgi uwsgi scgi; do temps="$temps ${t}_temp_path $tmp/$t;"; done
started=0
for _ in 1 2 3 4 5; do
    nport=$((20000 + RANDOM % 20000))
    sed -e "s#server attnd-1:[0-9]*#server 127.0.0.1:$p1#" \
        -e "s#server attnd-2:[0-9]*#server 127.0.0.1:$p2#" \
        -e "s#listen [0-9]*;#listen 127.0.0.1:$nport;#" \
        -e "s#^pid .*#pid $tmp/nginx.pid;#" \
        -e "s#/dev/stdout#$tmp/access.log#; s#/dev/stderr#$tmp/error.log#" \
        -e "s#^http {#http {$temps#" \
        -e "s#^worker_processes .*#worker_processes 1;#" \
        "$conf" >"$tmp/nginx.conf"
    # In the foreground (daemon off) so that this script holds its pid and can stop it.
    "$nginx" -p "$tmp" -c "$tmp/nginx.conf" -g "daemon off; error_log $tmp/error.log;" \
        2>"$tmp/nginx.err" &
    nginx_pid=$!
    for _ in $(seq 50); do
        if ! kill -0 "$nginx_pid" 2>/dev/null; then
            wait "$nginx_pid" 2>/dev/null
            nginx_pid=""
            break
        fi
        if curl -s -o /dev/null "http://127.0.0.1:$nport/"; then
            started=1
            break
        fi
        sleep 0.1
    done
    [ "$started" = 1 ] && break
    stop_nginx # running but not answering on this port: the next try starts another
done
if [ "$started" != 1 ]; then
    fail "nginx did not start: $(tr '\n' ' ' <"$tmp/nginx.err" | tail -c 400)"
    finish
fi
lb="http://127.0.0.1:$nport"

code=$(curl -s -o /dev/null -w '%{http_code}' "$lb/v2/health/ready")
if [ "$code" = 200 ]; then ok "GET /v2/health/ready through nginx: 200"; else fail "GET /v2/health/ready through nginx: $code"; fi

body='{"query": [[1, 0]], "key": [[1, 0], [0, 1]], "value": [[1, 2], [3, 4]]}'
bad=0
for _ in $(seq 20); do
    code=$(curl -s -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' -d "$body" "$lb/v1/attention")
    [ "$code" = 200 ] || bad=$((bad + 1))
done
served() { curl -s "http://127.0.0.1:$1/metrics" | awk '/^attnd_requests_total\{route="\/v1\/attention",code="200"\}/ { s += $2 } END { print s + 0 }'; }
s1=$(served "$p1")
s2=$(served "$p2")
if [ "$bad" = 0 ] && [ "$s1" -gt 0 ] && [ "$s2" -gt 0 ]; then
    ok "20 attention requests through nginx: all 200, replicas served $s1 and $s2"
else
    fail "20 attention requests through nginx: $bad not 200, replicas served $s1 and $s2"
fi

"$client" "$lb" >"$tmp/client" 2>&1
rc=$?
if [ "$rc" = 0 ] && grep -qE '^[1-9][0-9]* passed, 0 failed' "$tmp/client"; then
    ok "shard_client through nginx: $(tail -n 1 "$tmp/client")"
else
    fail "shard_client through nginx (exit $rc): $(grep -v '^ok ' "$tmp/client" | tr '\n' ' ' | tail -c 600)"
fi

"$client" "$lb" --sessions 20 50 "$tmp/sessions" >"$tmp/sessions.out" 2>&1
rc=$?
if [ "$rc" = 0 ] && grep -q '^ok sessions' "$tmp/sessions.out"; then
    ok "$(grep '^ok sessions' "$tmp/sessions.out" | sed 's/^ok //')"
else
    fail "sessions through nginx (exit $rc): $(grep -v '^ok ' "$tmp/sessions.out" | tr '\n' ' ' | tail -c 600)"
fi

# Declared sizes only: nginx decides from Content-Length before any body byte arrives.
limit_bytes=$(awk -v s="$body_limit" 'BEGIN {
    n = s + 0; u = toupper(substr(s, length(n "") + 1, 1));
    m = (u == "K") ? 1024 : (u == "M") ? 1048576 : (u == "G") ? 1073741824 : (u == "T") ? 1099511627776 : 1;
    printf "%.0f", n * m }')
declare_body() { # size -> the status line nginx sends within 2 s, or nothing
    (
        exec 3<>"/dev/tcp/127.0.0.1/$nport" || exit
        printf 'POST /v1/attention HTTP/1.1\r\nHost: lb\r\nContent-Type: application/json\r\nContent-Length: %s\r\n\r\n' "$1" >&3
        timeout 2 head -n 1 <&3 | tr -d '\r'
    )
}
over=$(declare_body $((limit_bytes + 1)))
at=$(declare_body "$limit_bytes")
if [[ "$over" == *" 413 "* ]] && [[ "$at" != *" 413 "* ]]; then
    ok "body limit: nginx answers 413 to $((limit_bytes + 1)) bytes and passes $limit_bytes (ATTND_MAX_BODY_BYTES=$body_limit)"
else
    fail "body limit: over the limit got '${over:-nothing}', at the limit got '${at:-nothing}'"
fi

# A replica stops: nginx keeps answering from the other.
kill -TERM "${pids[0]}"
wait "${pids[0]}" 2>/dev/null
bad=0
for _ in $(seq 10); do
    code=$(curl -s -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' -d "$body" "$lb/v1/attention")
    [ "$code" = 200 ] || bad=$((bad + 1))
done
if [ "$bad" = 0 ]; then
    ok "replica 1 stopped: 10 requests through nginx all answered 200 by replica 2"
else
    fail "replica 1 stopped: $bad of 10 requests through nginx failed"
fi
"$client" "$lb" --sessions-after 20 50 "$tmp/sessions" >"$tmp/sessions.out" 2>&1
rc=$?
if [ "$rc" = 0 ] && grep -q '^ok sessions' "$tmp/sessions.out"; then
    ok "replica 1 stopped: $(grep '^ok sessions' "$tmp/sessions.out" | sed 's/^ok sessions after a replica stopped: //')"
else
    fail "sessions after replica 1 stopped (exit $rc): $(grep -v '^ok ' "$tmp/sessions.out" | tr '\n' ' ' | tail -c 600)"
fi
finish
