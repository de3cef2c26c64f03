#!/bin/sh
# Runs a test program N times in a row and stops at the first failure,
# printing that run's output; for the stress suite, where a test that
# fails one run in fifty is caught rather than retried.
# usage: repeat.sh N PROGRAM [ARGS...]
set -u
n=$1
shift
out=$(mktemp "${TMPDIR:-/tmp}/lmt-repeat.XXXXXX")
trap 'rm -f "$out"' EXIT INT TERM
i=1
while [ "$i" -le "$n" ]; do
	start=$(date +%s)
	"$@" >"$out" 2>&1
	rc=$?
	if [ "$rc" -eq 77 ]; then
		cat "$out"
		exit 77
	fi
	if [ "$rc" -ne 0 ]; then
		cat "$out"
		echo "FAIL: run $i of $n exited with $rc"
		exit 1
	fi
	echo "run $i of $n passed ($(($(date +%s) - start)) s)"
	i=$((i + 1))
done
echo "PASS: $n runs in a row"
