# check.sh - the shell suites' counterpart of check.h: one line per check and the closing
# "N passed, N failed[, N skipped]" that tests/run.sh reads. Source it, then:
#
#   . "$root/tests/support/check.sh"
#   ok "the image builds"             # counts a pass
#   fail "port 8080: nothing listens" # counts a failure
#   skip "compose: no nginx here"     # counts a skip, with its reason
#   finish                            # prints the totals; exits non-zero after a failure
passed=0
failed=0
skipped=0
ok() { echo "ok $*"; passed=$((passed + 1)); }
fail() { echo "FAIL $*"; failed=$((failed + 1)); }
skip() { echo "skip $*"; skipped=$((skipped + 1)); }
finish() {
    local extra=""
    [ "$skipped" -gt 0 ] && extra=", $skipped skipped"
    echo "$passed passed, $failed failed$extra"
    [ "$failed" -eq 0 ]
    exit
}
