#!/usr/bin/env bash
# make fresh-check: the README's two commands on a bare Debian 12. Builds a minimal bookworm root
# with debootstrap (minbase, plus make and git), clones the committed tree into it with no
# folder beside it, then inside it runs `make run` until the daemon answers its health check,
# and `make test` to its end. Needs root (debootstrap, chroot, mounts) and reaches Debian's and
# npm's registries as this machine does: its apt sources and settings, and its extra CA
# certificates, are copied into the root first. Minutes (a whole make test, package installs
# included); not part of make test.
#
#   tests/check_fresh.sh [ROOT]      (default build/fresh/root; kept for the next run's packages)
#
# FRESH_NEW=1 builds the root anew. Ends with "N passed, N failed": one for each of make run and
# make test; make test's own last line is printed above it.
set -u
repo=$(cd "$(dirname "$0")/.." && pwd)
root=$(realpath -m "${1:-$repo/build/fresh/root}")
log=$(dirname "$root")/make-test.log
port=18080

die() {
    echo "fresh-check: $1"
    echo "0 passed, 1 failed"
    exit 1
}
[ "$(id -u)" = 0 ] || die "needs root (debootstrap, chroot and mounts)"
command -v debootstrap >/dev/null || {
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
} || die "debootstrap is missing and could not be installed"

# Signals every process whose root is the fresh root (make run's daemon, what a failed run left).
signal_root() {
    local proc
    for proc in /proc/[0-9]*; do
        [ "$(readlink "$proc/root" 2>/dev/null)" = "$root" ] && kill "-$1" "${proc#/proc/}" 2>/dev/null
    done
}

mounts=()
cleanup() {
    signal_root KILL
    local i
    for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
        umount -l "${mounts[$i]}" 2>/dev/null
    done
}
trap cleanup EXIT

# The first deb822 URI of this machine's Debian sources, or its sources.list's.
mirror=$(sed -n 's/^URIs:[[:space:]]*\([^[:space:]]*\/debian\)$/\1/p' /etc/apt/sources.list.d/*.sources \
    2>/dev/null | head -n 1)
[ -n "$mirror" ] || mirror=$(awk '$1 == "deb" && $2 ~ /\/debian$/ { print $2; exit }' \
    /etc/apt/sources.list 2>/dev/null)
mirror=${mirror:-http://deb.debian.org/debian}

if [ "${FRESH_NEW:-0}" = 1 ] || [ ! -x "$root/usr/bin/make" ]; then
    rm -rf "$root"
    mkdir -p "$root"
    echo "fresh-check: debootstrap bookworm (minbase, make, git) from $mirror into $root"
    debootstrap --variant=minbase --include=make,git,ca-certificates bookworm "$root" "$mirror" \
        >"$root.debootstrap.log" 2>&1 || {
        tail -20 "$root.debootstrap.log"
        die "debootstrap failed"
    }
    # Debian's sources and apt settings as this machine has them, and its extra CAs.
    rm -f "$root/etc/apt/sources.list"
    cp /etc/apt/sources.list.d/*.sources "$root/etc/apt/sources.list.d/" 2>/dev/null
    [ -s /etc/apt/sources.list ] && cp /etc/apt/sources.list "$root/etc/apt/"
    cp /etc/apt/apt.conf.d/* "$root/etc/apt/apt.conf.d/" 2>/dev/null
    cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/" 2>/dev/null
    chroot "$root" update-ca-certificates >/dev/null || die "update-ca-certificates failed"
fi

for m in proc sys dev dev/pts; do
    mkdir -p "$root/$m"
    mount --bind "/$m" "$root/$m" || die "cannot bind /$m"
    mounts+=("$root/$m")
done
mkdir -p "$root/dev/shm"
mount -t tmpfs -o size=2g tmpfs "$root/dev/shm" && mounts+=("$root/dev/shm")
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null

rm -rf "$root/src/attnd"
mkdir -p "$root/src"
git clone -q --no-local "$repo" "$root/src/attnd" || die "git clone of $repo failed"
echo "fresh-check: $(git -C "$root/src/attnd" log --oneline -1)"

# Inside the root: a login-like environment with the CA bundle for Node.js and npm, as here.
in_root() {
    chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        LANG=C.UTF-8 CI=true NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt \
        npm_config_cafile=/etc/ssl/certs/ca-certificates.crt \
        ${OPENBLAS_CORETYPE:+OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE} \
        ${OPENBLAS_L2_SIZE:+OPENBLAS_L2_SIZE=$OPENBLAS_L2_SIZE} \
        bash -c "cd /src/attnd && $1"
}

passed=0
failed=0
echo "fresh-check: make run ARGS='--port $port'"
in_root "make run ARGS='--port $port'" >"$(dirname "$root")/make-run.log" 2>&1 &
run_pid=$!
served=0
for _ in $(seq 900); do
    if in_root "[ -x build/attnd ] && build/attnd --healthcheck --port $port" >/dev/null 2>&1; then
        served=1
        break
    fi
    kill -0 "$run_pid" 2>/dev/null || break
    sleep 1
done
if [ "$served" = 1 ]; then
    echo "ok make run serves on 127.0.0.1:$port"
    passed=$((passed + 1))
else
    tail -20 "$(dirname "$root")/make-run.log"
    echo "FAIL make run did not serve on 127.0.0.1:$port"
    failed=$((failed + 1))
fi
signal_root TERM
wait "$run_pid" 2>/dev/null

echo "fresh-check: make test (log: $log)"
start=$(date +%s)
in_root "make test" >"$log" 2>&1
rc=$?
echo "fresh-check: make test exit $rc in $(($(date +%s) - start)) s: $(tail -n 1 "$log")"
if [ "$rc" -eq 0 ] && tail -n 1 "$log" | grep -qE '^[0-9]+ passed, 0 failed$'; then
    echo "ok make test passes"
    passed=$((passed + 1))
else
    grep -E '^== .*[1-9][0-9]* failed' "$log" | head -20
    echo "FAIL make test"
    failed=$((failed + 1))
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
