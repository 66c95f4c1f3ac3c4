#!/bin/sh
# tests/fuzz/run.sh BUILD SECONDS TARGET...: run each libFuzzer harness BUILD/fuzz_TARGET for
# SECONDS from its seed corpus (tests/fuzz/corpus/TARGET, read only) and the inputs earlier runs
# kept (BUILD/corpus/TARGET, where new ones go). A crash, leak, timeout or out-of-memory input is
# saved as BUILD/crashes/TARGET-*; the log of each run is BUILD/fuzz-TARGET.log. Exits 1 when any
# target found something (the others still run). First each harness replays the inputs that once
# found a bug (tests/fuzz/regressions/TARGET/, fixed since). Replay one input: BUILD/fuzz_TARGET FILE.
set -u
build=$1 secs=$2
shift 2
found=""
for t in "$@"; do
    mkdir -p "$build/corpus/$t" "$build/crashes"
    dict=""
    [ -f "tests/fuzz/$t.dict" ] && dict="-dict=tests/fuzz/$t.dict"
    log="$build/fuzz-$t.log"
    if [ -d "tests/fuzz/regressions/$t" ] && [ -n "$(ls "tests/fuzz/regressions/$t")" ]; then
        if ! "$build/fuzz_$t" tests/fuzz/regressions/"$t"/* >"$log" 2>&1; then
            found="$found $t"
            echo "fuzz: $t: an old finding is back (log: $log):"
            grep -E 'Running:|ERROR|SUMMARY|contract broken' "$log" | tail -5 | sed 's/^/    /'
            continue
        fi
        echo "fuzz: $t: $(ls "tests/fuzz/regressions/$t" | wc -l) old findings replayed, none is back"
    fi
    echo "fuzz: $t for $secs s (log: $log)"
    # -timeout: one input may take this long (a chat template at its render step limit takes a
    # few seconds under ASan on a loaded machine); -rss_limit_mb: the renderer's 512 MiB limit
    # plus ASan's shadow and quarantine
    "$build/fuzz_$t" -max_total_time="$secs" -timeout=60 -rss_limit_mb=4096 -print_final_stats=1 \
        -artifact_prefix="$build/crashes/$t-" $dict "$build/corpus/$t" "tests/fuzz/corpus/$t" >"$log" 2>&1
    rc=$?
    grep -E '^(stat::number_of_executed_units|stat::peak_rss_mb|#[0-9]+ +DONE)' "$log" | sed 's/^/    /'
    if [ $rc -ne 0 ]; then
        found="$found $t"
        echo "fuzz: $t FOUND SOMETHING (exit $rc):"
        grep -E 'ERROR|SUMMARY|contract broken|Test unit written|deadly signal|timeout|out-of-memory' "$log" | head -20 | sed 's/^/    /'
    fi
done
if [ -n "$found" ]; then
    echo "fuzz: findings in:$found (inputs in $build/crashes/)"
    exit 1
fi
echo "fuzz: nothing found in $*"
