#!/bin/sh
# Run one libFuzzer harness for LMT_FUZZ_SECONDS (default 35) from its seed
# corpus, in a scratch corpus directory, and print what it did. A crash,
# leak or timeout exits 1: libFuzzer's own codes (77 for a crash) would
# read as a skipped test.
#   run-fuzzer.sh FUZZER SEED_DIR
set -eu
fuzzer=$1
seeds=$2
secs=${LMT_FUZZ_SECONDS:-35}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/corpus" "$work/crashes"
export ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=1:intercept_tls_get_addr=0"
status=0
"$fuzzer" -max_total_time="$secs" -max_len=65536 -timeout=20 -print_final_stats=1 \
	-error_exitcode=1 -timeout_exitcode=1 \
	-artifact_prefix="$work/crashes/" "$work/corpus" "$seeds" >"$work/log" 2>&1 || status=$?
grep -E '^#[0-9]+[[:space:]]+(INITED|DONE)|^stat::(number_of_executed_units|peak_rss_mb)' "$work/log" || true
if [ "$status" -ne 0 ]; then
	tail -60 "$work/log"
	for f in "$work"/crashes/*; do
		[ -f "$f" ] && echo "reproducer ($f):" && od -An -tx1 "$f" | head -20
	done
	exit "$status"
fi
echo "fuzz $(basename "$fuzzer"): $secs s, no crash, leak or timeout"
