#!/usr/bin/env bash
# Proves the container image without a Docker engine, so that it runs wherever make test does:
#
# 1. lint: the Dockerfile passes dockerfile-utils' validator and the project's structural rules
#    (image.mjs lint); hadolint too when it is installed (it is in neither Debian's apt nor
#    npm). Deliberately broken copies of the Dockerfile must fail the lint, so it can fail.
#    And the build stage's make succeeds on a copy of just the sources its COPYs name.
# 2. libraries: the Debian packages that provide the shared libraries build/attnd links
#    (readelf NEEDED, resolved by ldd, dpkg -S on the real path) are exactly the packages the
#    runtime stage installs, less those every Debian base image has (libc6, libgcc-s1,
#    zlib1g); and every library ldd resolves, direct or not, comes from those packages'
#    dependency closure (apt-cache depends --recurse) or the base image. On a Debian 12 host,
#    the release of the image, the host's resolution is the image's (elsewhere this is skipped).
# 3. flags: every attnd flag and ATTND_* variable used by the Dockerfile and deploy/ exists in
#    `build/attnd --help`.
#
# Checks that need build/attnd are skipped, with the reason, when it has not been built.
# Ends with "N passed, N failed[, N skipped]"; exits non-zero on a failure.
#
#   tests/deploy/check_image.sh [path/to/attnd]
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=${1:-${ATTND_BIN:-$root/build/attnd}}

# Packages every debian:bookworm-slim image has: not installed by the runtime stage, and
# allowed in its list (zlib1g is named there because the Makefile links -lz).
base_packages="libc6 libgcc-s1 zlib1g"
# Flags the Dockerfile and manifests use that the daemon does not offer yet: reported as
# skipped, not failed, until --help lists them. --healthcheck is the daemon probing itself:
# GET /v2/health/ready on the configured host and port, exit 0 on 200, else 1.
pending_flags="healthcheck"

. "$root/tests/support/check.sh"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# shellcheck source=tests/deploy/node_env.sh
. "$here/node_env.sh"
node_ok=1
if ! msg=$(deploy_node_ready); then
    fail "deploy checks need Node.js packages: $msg"
    node_ok=0
elif [ -n "$msg" ]; then
    echo "$msg"
fi

# ---- 1. lint ---------------------------------------------------------------------------------

if [ "$node_ok" = 1 ]; then
    node "$here/image.mjs" lint >"$tmp/lint" 2>&1
    grep -v -E '^[0-9]+ passed, [0-9]+ failed' "$tmp/lint"
    passed=$((passed + $(grep -c '^ok ' "$tmp/lint")))
    failed=$((failed + $(grep -c '^FAIL ' "$tmp/lint")))
    if ! grep -q -E '^[0-9]+ passed, 0 failed' "$tmp/lint"; then
        grep -q '^FAIL ' "$tmp/lint" || fail "image.mjs lint did not finish"
    fi

    # Each mutation breaks one rule; the lint must reject every one of them.
    mutations=(
        's/--no-install-recommends//'
        's#^USER 10001:10001#USER root#'
        's#^FROM debian:bookworm-20250520-slim#FROM debian:latest#'
        '/^HEALTHCHECK/,/CMD \["attnd", "--healthcheck"\]/d'
        '/^STOPSIGNAL/d'
        's/OPENBLAS_NUM_THREADS=1/OPENBLAS_NUM_THREADS=4/'
        's#rm -rf /var/lib/apt/lists/\*#true#'
        's#^ENTRYPOINT .*#ENTRYPOINT attnd --host 0.0.0.0#'
        's#^COPY --from=build #COPY #'
        's#^EXPOSE 8080#EXPOSE 80#'
        's#^WORKDIR /src#ADD https://example.com/x.tar.gz /src#'
    )
    missed=""
    for i in "${!mutations[@]}"; do
        sed -e "${mutations[$i]}" "$root/Dockerfile" >"$tmp/Dockerfile.$i"
        if cmp -s "$root/Dockerfile" "$tmp/Dockerfile.$i"; then
            missed="$missed [mutation $i changed nothing: ${mutations[$i]}]"
        elif ATTND_DOCKERFILE="$tmp/Dockerfile.$i" node "$here/image.mjs" lint >/dev/null 2>&1; then
            missed="$missed [lint accepted: ${mutations[$i]}]"
        fi
    done
    if [ -z "$missed" ]; then
        ok "lint rejects each of ${#mutations[@]} broken copies of the Dockerfile"
    else
        fail "lint self-test:$missed"
    fi
fi

if command -v hadolint >/dev/null 2>&1; then
    if hadolint "$root/Dockerfile" >"$tmp/hadolint" 2>&1; then
        ok "hadolint Dockerfile"
    else
        fail "hadolint Dockerfile: $(tr '\n' ' ' <"$tmp/hadolint")"
    fi
else
    echo "note: hadolint is not installed (Debian's apt has no hadolint package, npm none either);" \
        "dockerfile-utils and the structural rules above stand in for it"
fi

# The build stage sees only what its COPYs bring in (through .dockerignore): copy exactly that,
# less object and dependency files, into a scratch context and run the stage's make there, so a
# source the COPY lines miss (a new top-level folder, say) fails here rather than in a registry
# build. It compiles at -O1 without debug information: what it proves is that the sources are
# there, not the code's speed.
# ATTND_SKIP_CONTEXT_BUILD=1 skips it (it compiles attnd once more).
if [ "$node_ok" = 1 ] && [ "${ATTND_SKIP_CONTEXT_BUILD:-0}" != 1 ]; then
    ctx="$tmp/context"
    mkdir -p "$ctx"
    copied=""
    while read -r _ src; do
        (cd "$root" && tar cf - --exclude='*.o' --exclude='*.d' "$src") | (cd "$ctx" && tar xf -)
        copied="$copied $src"
    done < <(node "$here/image.mjs" build-context)
    if make -C "$ctx" -j"$(nproc)" OPT=-O1 CFLAGS=-g0 build/attnd >"$tmp/context.log" 2>&1 &&
        "$ctx/build/attnd" --help >/dev/null 2>&1; then
        ok "build stage: make build/attnd succeeds with only the COPYed sources ($copied )"
    else
        fail "build stage: make build/attnd fails with only the COPYed sources ($copied ): $(tail -n 5 "$tmp/context.log" | tr '\n' ' ')"
    fi
fi

# ---- 2. libraries ----------------------------------------------------------------------------

# The package that owns a library file, without the :arch suffix: dpkg -S on its real path,
# and, because Debian 12 merges /lib into /usr/lib while dpkg keeps the names packages were
# built with, on the /lib and /usr/lib spellings of the real and the given path too.
package_of() {
    local real cand pkg
    real=$(readlink -f "$1")
    for cand in "$real" "$1" "${real/#\/usr\/lib\//\/lib\/}" "${1/#\/lib\//\/usr\/lib\/}" \
        "${real/#\/usr\/lib64\//\/lib64\/}" "${1/#\/lib64\//\/usr\/lib64\/}"; do
        pkg=$(dpkg -S "$cand" 2>/dev/null | head -n 1 | cut -d: -f1)
        if [ -n "$pkg" ]; then
            echo "$pkg"
            return
        fi
    done
}

in_list() { # word list...
    local w=$1
    shift
    for x in "$@"; do [ "$x" = "$w" ] && return 0; done
    return 1
}

if [ ! -x "$bin" ]; then
    skip "libraries: $bin is not built yet (make build/attnd)"
    skip "flags: $bin is not built yet (make build/attnd)"
else
    codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
    if [ "$codename" != "bookworm" ]; then
        skip "libraries: this host is '${codename:-unknown}', not Debian 12 bookworm like the image, so its library packages prove nothing about the image's"
    elif [ "$node_ok" != 1 ]; then
        skip "libraries: the runtime stage's package list is read by image.mjs, which needs Node.js"
    else
        read -r -a runtime <<<"$(node "$here/image.mjs" runtime-packages | tr '\n' ' ')"
        read -r -a base <<<"$base_packages"
        ldd "$bin" >"$tmp/ldd" 2>&1
        problems=""
        if grep -q 'not found' "$tmp/ldd"; then
            problems="$problems ldd: $(grep 'not found' "$tmp/ldd" | tr -s ' \t' ' ')."
        fi
        # Direct dependencies: readelf NEEDED, resolved to paths by ldd.
        needed_pkgs=()
        for lib in $(readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
            path=$(awk -v l="$lib" '$1 == l && $2 == "=>" { print $3 }' "$tmp/ldd")
            if [ -z "$path" ]; then
                problems="$problems $lib does not resolve."
                continue
            fi
            pkg=$(package_of "$path")
            if [ -z "$pkg" ]; then
                problems="$problems $lib ($path) belongs to no Debian package."
                continue
            fi
            echo "    $lib -> $(readlink -f "$path") -> $pkg"
            in_list "$pkg" "${needed_pkgs[@]}" || needed_pkgs+=("$pkg")
        done
        for pkg in "${needed_pkgs[@]}"; do
            if ! in_list "$pkg" "${runtime[@]}" && ! in_list "$pkg" "${base[@]}"; then
                problems="$problems $pkg is needed but the runtime stage does not install it."
            fi
        done
        for pkg in "${runtime[@]}"; do
            if ! in_list "$pkg" "${needed_pkgs[@]}"; then
                if in_list "$pkg" "${base[@]}"; then
                    echo "    note: the runtime stage names $pkg, which build/attnd does not link now; it is in the base image anyway"
                else
                    problems="$problems the runtime stage installs $pkg, which build/attnd does not need."
                fi
            fi
        done
        if [ -z "$problems" ]; then
            ok "libraries: NEEDED libraries map to exactly the runtime stage's packages (${runtime[*]}; base image: $base_packages)"
        else
            fail "libraries:$problems"
        fi

        # Indirect dependencies: each library ldd loads comes with the runtime packages.
        apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
            --no-replaces --no-enhances "${runtime[@]}" 2>/dev/null |
            grep -v '^ ' | sed 's/:.*//' | sort -u >"$tmp/closure"
        problems=""
        count=0
        while read -r path; do
            count=$((count + 1))
            pkg=$(package_of "$path")
            if [ -z "$pkg" ]; then
                problems="$problems $path belongs to no package."
            elif ! grep -qx "$pkg" "$tmp/closure" && ! in_list "$pkg" "${base[@]}"; then
                problems="$problems $path ($pkg) is not in the runtime packages' dependencies."
            fi
        done < <(awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' "$tmp/ldd")
        if [ ! -s "$tmp/closure" ]; then
            fail "libraries: apt-cache depends gave no dependency closure for ${runtime[*]}"
        elif [ -z "$problems" ]; then
            ok "libraries: all $count libraries ldd loads come from the runtime packages' dependency closure or the base image"
        else
            fail "libraries (indirect):$problems"
        fi
    fi

    # ---- 3. flags ------------------------------------------------------------------------------
    if "$bin" --help >"$tmp/help" 2>&1; then :; fi
    sed -n 's/^ *--\([a-z][a-z0-9-]*\).*/\1/p' "$tmp/help" | sort -u >"$tmp/help_flags"
    grep -o 'env: ATTND_[A-Z0-9_]*' "$tmp/help" | sed 's/env: //' | sort -u >"$tmp/help_env"
    if [ ! -s "$tmp/help_flags" ]; then
        fail "flags: '$bin --help' lists no flags"
    elif [ "$node_ok" != 1 ]; then
        skip "flags: the files' flags are read by image.mjs, which needs Node.js"
    else
        node "$here/image.mjs" usage >"$tmp/usage"
        problems=""
        pending=""
        n=0
        while read -r kind name file; do
            n=$((n + 1))
            if [ "$kind" = flag ]; then
                grep -qx "$name" "$tmp/help_flags" && continue
                if in_list "$name" $pending_flags; then
                    case " $pending " in *" --$name "*) ;; *) pending="$pending --$name" ;; esac
                    continue
                fi
                problems="$problems --$name ($file) is not in --help."
            else
                grep -qx "$name" "$tmp/help_env" ||
                    problems="$problems $name ($file) is no flag's environment variable in --help."
            fi
        done <"$tmp/usage"
        if [ -z "$problems" ]; then
            ok "flags: the $n uses of attnd flags and ATTND_* variables in Dockerfile and deploy/ all exist in --help"
        else
            fail "flags:$problems"
        fi
        for f in $pending; do
            skip "flags: $f is used (Dockerfile HEALTHCHECK, compose healthcheck) but not in --help yet: the server must add it (GET /v2/health/ready on the configured port, exit 0 or 1)"
        done
    fi
fi

finish
