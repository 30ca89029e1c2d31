#!/usr/bin/env bash
# Fails when the files of one tier (server/, api/ or engine/) depend on each other in a circle,
# read two ways.
#
# Includes: a part of the tier is a file stem (foo.c and foo.h are part "foo"; the public
# header server.h is a part of its own, the interface of the whole module rather than
# server.c's). Part A depends on part B when server/A.c or server/A.h includes "server/B.h".
# Calls: in the built library, object A depends on object B when A uses a symbol B defines
# (nm). Calls through the route table's and the watcher's function pointers are not edges,
# which is the point of those tables. The include graph alone would miss a circle hidden
# behind one shared header; the call graph alone would miss one between headers.
# tsort(1) finds a circle and names its parts. Before looking at the tree the script checks
# that it catches a planted circle of each kind, so that it cannot pass by not looking.
#
#   tests/check_cycles.sh [DIR [LIBRARY]]   (default: server build/libserver.a)
# Ends with "N passed, N failed" like every suite (tests/run.sh).
set -u

dir=${1:-server}
lib=${2:-build/libserver.a}
. "$(dirname "$0")/support/check.sh"

# Prints "from to" for each include edge between different parts of folder $1 (a tier: server,
# api or engine, subfolders included), whose files include each other as "TIER/PATH.h". A part
# is a path without its extension; the tier's public header TIER/TIER.h is a part of its own.
include_edges() {
    local root=$1 tier f rel part dep
    tier=$(basename "$root")
    find "$root" -name '*.[ch]' | sort | while read -r f; do
        rel=${f#"$root"/}
        part=${rel%.*}
        [ "$rel" = "$tier.h" ] && part=$tier.h
        sed -n "s|^[[:space:]]*#[[:space:]]*include[[:space:]]*\"$tier/\([A-Za-z0-9_/]*\)\.h\".*|\1|p" \
            "$f" | while read -r dep; do
            [ "$dep" = "$tier" ] && dep=$tier.h
            [ "$dep" = "$part" ] || echo "$part $dep"
        done
    done
}

# Prints "from to" for each object of archive $1 that uses a symbol another one defines.
call_edges() {
    nm -g "$1" 2>/dev/null | awk '
        /\.o:$/ { obj = substr($1, 1, length($1) - 3); next }
        NF == 2 && $1 == "U" { used[obj, $2] = 1; next }
        NF == 3 && $2 ~ /^[A-Z]$/ { owner[$3] = obj }
        END {
            for (key in used) {
                split(key, k, SUBSEP)
                if ((k[2] in owner) && owner[k[2]] != k[1])
                    print k[1], owner[k[2]]
            }
        }'
}

# Reads edges on stdin; exit status 0 when they hold no circle (tsort names one on stderr).
acyclic() {
    sort -u | tsort >/dev/null
}

# check NAME EDGES: one test line for one graph of the tree.
check() {
    if [ -z "$2" ]; then
        fail "no $1 edge found: wrong folder or library?"
    elif acyclic <<<"$2"; then
        ok "no $1 cycle between the files of $dir/ ($(sort -u <<<"$2" | wc -l) edges)"
    else
        fail "the files of $dir/ form a $1 cycle (its parts are named above)"
    fi
}

# planted NAME EDGES: the check must fail on a graph known to hold a circle.
planted() {
    if acyclic <<<"$2" 2>/dev/null; then
        fail "a planted $1 cycle went unnoticed"
    else
        ok "a planted $1 cycle is caught"
    fi
}

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch/server/sub"
printf '#include "server/b.h"\n' >"$scratch/server/a.c"
printf '#include "server/sub/c.h"\n' >"$scratch/server/b.c"
printf '#include "server/a.h"\n' >"$scratch/server/sub/c.h"
: >"$scratch/server/a.h"
: >"$scratch/server/b.h"
planted include "$(include_edges "$scratch/server")"
printf 'void b(void);\nvoid a(void) { b(); }\n' >"$scratch/x.c"
printf 'void a(void);\nvoid b(void) { a(); }\n' >"$scratch/y.c"
if ${CC:-cc} -c "$scratch/x.c" -o "$scratch/x.o" && ${CC:-cc} -c "$scratch/y.c" -o "$scratch/y.o" &&
    ar rcs "$scratch/xy.a" "$scratch/x.o" "$scratch/y.o"; then
    planted call "$(call_edges "$scratch/xy.a")"
else
    fail "could not build the planted call cycle"
fi

check include "$(include_edges "$dir")"
if [ -f "$lib" ]; then
    check call "$(call_edges "$lib")"
else
    fail "$lib is missing: build it first (make $lib)"
fi

finish
