#!/bin/sh
# minivmm's integration test: start a destination minivmm, then a source that
# live-migrates its guest there, and check both exit codes and the guest's
# own report on the destination. Mode "drop-dirty": the source hides one
# dirty page, and the destination's guest must name a bad word in that page.
#   test-migrate.sh MINIVMM PLUGIN OPTIONS migrate|drop-dirty
set -u
vmm=$1
plugin=$2
opts=$3
mode=$4

"$vmm" --check-kvm
rc=$?
[ $rc -eq 77 ] && exit 77
[ $rc -eq 0 ] || { echo "minivmm --check-kvm failed ($rc)"; exit 1; }

dir=$(mktemp -d)
dest_pid=
trap '[ -n "$dest_pid" ] && kill "$dest_pid" 2>/dev/null; rm -rf "$dir"' EXIT
set -- --plugin "$plugin" --ram 64M --timeout-ms 60000
[ -n "$opts" ] && set -- "$@" -o "$opts"

show() {
	for f in dest.out dest.err src.out src.err; do
		sed "s/^/[$f] /" "$dir/$f" 2>/dev/null
	done
}

fail() {
	show
	echo "FAIL: $*"
	exit 1
}

"$vmm" --listen 127.0.0.1:0 --verify-ms 1000 "$@" >"$dir/dest.out" 2>"$dir/dest.err" &
dest_pid=$!
port=
tries=0
while [ -z "$port" ] && [ $tries -lt 200 ]; do
	port=$(sed -n 's/^minivmm: destination: listening on .*:\([0-9][0-9]*\)$/\1/p' \
		"$dir/dest.out")
	kill -0 "$dest_pid" 2>/dev/null || break
	[ -n "$port" ] || sleep 0.05
	tries=$((tries + 1))
done
[ -n "$port" ] || fail "the destination did not start listening"

extra=
[ "$mode" = drop-dirty ] && extra=--test-drop-dirty
"$vmm" --migrate-to "127.0.0.1:$port" --run-ms 1500 $extra "$@" \
	>"$dir/src.out" 2>"$dir/src.err"
src_rc=$?
wait "$dest_pid"
dest_rc=$?
dest_pid=
show

[ $src_rc -eq 0 ] || fail "the source exited with $src_rc"
if [ "$mode" = migrate ]; then
	[ $dest_rc -eq 0 ] || fail "the destination exited with $dest_rc"
	grep -q '^minivmm: destination: OK:' "$dir/dest.out" ||
		fail "the destination's guest did not report good memory"
	echo "PASS: the guest carried on and checked its memory on the destination"
	exit 0
fi

page=$(sed -n 's/^minivmm: test: never reporting the page at \(0x[0-9a-f]*\) .*/\1/p' \
	"$dir/src.out")
bad=$(sed -n 's/^minivmm: destination: FAILED: .* bad word at \(0x[0-9a-f]*\) .*/\1/p' \
	"$dir/dest.out")
[ $dest_rc -ne 0 ] || fail "the destination exited 0 with a page never re-sent"
[ -n "$page" ] || fail "the source did not say which page it hid"
[ -n "$bad" ] || fail "the destination's guest did not report a bad word"
[ $((bad & ~4095)) -eq $((page)) ] ||
	fail "the guest reported $bad, outside the hidden page $page"
echo "PASS: the guest found the stale page: bad word at $bad in the hidden page $page"
