#!/bin/busybox sh
# /init of the rxe suite's guest: loads rdma_rxe, puts rxe0 on eth0, runs
# lmt-plugin-check, migrations over the verbs plugin and ib_write_bw, reports
# on the console.
/bin/busybox mkdir -p /bin /usr/bin /sbin
/bin/busybox --install -s /bin
export PATH=/bin:/usr/bin:/sbin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
# The initramfs is writable as it is; a tmpfs on /tmp would hide a build
# tree that lives under /tmp.
mkdir -p /tmp
. /lmt/env
export LMT_PLUGIN_PATH="$PLUGIN_DIR" LMT_LOG=warn HOME=/tmp
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:intercept_tls_get_addr=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
passed=0 failed=0 migrations=0 interrupted=0

say() {
	echo "lmt-rxe: $*"
}
finish() {
	say "RESULT passed=$passed failed=$failed migrations=$migrations" \
	    "interrupted=$interrupted"
	sync
	poweroff -f
	sleep 10
}
setup_fail() {
	say "FAIL setup: $*"
	failed=$((failed + 1))
	finish
}

# Run a command as one test; its output goes to the console.
run() {
	name=$1
	shift
	say "BEGIN $name"
	t0=$(date +%s)
	"$@" >/tmp/out 2>&1
	rc=$?
	cat /tmp/out
	if [ $rc -eq 0 ]; then
		passed=$((passed + 1))
		say "PASS $name ($(($(date +%s) - t0)) s)"
	else
		failed=$((failed + 1))
		say "FAIL $name (exit $rc)"
	fi
	return $rc
}

# A two-process migration of a guest that keeps dirtying, checked bit for bit.
# Under TCG the destination's read of its whole RAM for verify=on takes
# several hundred milliseconds on its own (the pause counts it), so the
# downtime limit is raised well past it: these runs check the data path,
# not the timing, which means nothing in an emulated guest.
migrate() {
	name=$1
	opts=$2
	migrations=$((migrations + 1))
	run "$name" "$BENCH" --plugin verbs --ram "$RAM" --dirty-rate "$DIRTY" --timeout 100s \
		-o "verify=on,downtime-limit=5s,$opts"
}

say "boot done after $(cut -d' ' -f1 /proc/uptime) s"
for m in $(cat /lmt/modules.order); do
	[ -d "/sys/module/$m" ] && continue
	insmod "/lmt/modules/$m.ko" || [ -d "/sys/module/$m" ] || setup_fail "insmod $m"
done
lsmod
"$IP" link set lo up || setup_fail "ip link set lo up"
"$IP" link set eth0 up || setup_fail "ip link set eth0 up (no virtio NIC?)"
"$IP" addr add 10.0.2.15/24 dev eth0 || setup_fail "ip addr add"
"$RDMA" link add rxe0 type rxe netdev eth0 || setup_fail "rdma link add rxe0"
i=0
while [ ! -e /dev/infiniband/uverbs0 ] && [ $i -lt 50 ]; do
	sleep 0.1
	i=$((i + 1))
done
"$RDMA" link show
"$PROBE" || setup_fail "no active rxe port"
say "rxe0 up after $(cut -d' ' -f1 /proc/uptime) s"

# The fault matrix over verbs (tests/integration/test_fault_matrix.c, with
# the chaos decorator), MATRIX_RUNS times in a row, stopping at the first
# failure: once in the rxe suite, 50 times (and nothing else, ONLY_MATRIX)
# in the stress suite's stress-fault-matrix-verbs.
# Linux before 6.2 pins memory for RDMA with write access even when the
# registration asks for none, so a read-only view of the source guest
# cannot be registered there: lmt then gets a writable one, and the
# matrix says that it did not check that lmt never writes the source.
matrix() {
	[ "$MATRIX_RUNS" -gt 0 ] || return 0
	[ -x "$MATRIX" ] || setup_fail "$MATRIX not built"
	case $(uname -r) in
	[0-5].* | 6.[01].*)
		view="Linux $(uname -r) pins a region for RDMA with write access even"
		view="$view when it asks for none (until 6.2), so a read-only view cannot be registered"
		;;
	*) view= ;;
	esac
	n=1
	while [ $n -le "$MATRIX_RUNS" ]; do
		LMT_PLUGIN_PATH="$PLUGIN_DIR:$CHAOS_DIR" LMT_TEST_PLUGIN=verbs LMT_TEST_OPTIONS= \
			LMT_TEST_MATRIX_OPTIONS="$MATRIX_OPTIONS" LMT_TEST_CELL="$MATRIX_CELL" \
			LMT_TEST_WRITABLE_VIEW="$view" run "fault-matrix-$n" "$MATRIX" || break
		n=$((n + 1))
	done
}
if [ "$ONLY_MATRIX" = 1 ]; then
	matrix
	finish
fi

# The contract suite on verbs, as check-<variant> runs it on the transports
# that need no RDMA device (tests/conformance); under TCG with a tenth of
# its open/close cycles, each leak check stopping after 10 s. The reopen
# check (docs/writing-a-plugin.md, "Reopening a channel") is a known
# failure on verbs until the plugin forgets a closed channel's completions
# and failure: it must fail, and the mark goes once it passes.
run plugin-check "$CHECK" --cycles 100 --cycle-time 10 \
    --expect-fail "reopen=verbs: a closed channel's completions and failure are not yet forgotten, and a source did not learn within 30 s under rxe that its destination closed its queue pairs" verbs

migrate ch1-pin-on "channels=1,pin-all=on"
migrate ch1-pin-off "channels=1,pin-all=off"
migrate ch2-pin-on "channels=2,pin-all=on"
migrate ch2-pin-off "channels=2,pin-all=off"
# Small chunks and a shallow queue: many registrations, back-pressure, and
# unsignalled tails that only a marker retires.
migrate ch2-pin-off-chunk64K-depth8 \
	"channels=2,pin-all=off,chunk-size=64K,queue-depth=8,verbs.signal-interval=4"
# Peers killed and sessions cancelled mid-migration: three migrations that
# must fail cleanly on both sides, and two that must then succeed.
if [ -x "$FAULTS" ]; then
	migrations=$((migrations + 2))
	interrupted=$((interrupted + 3))
	LMT_TEST_PLUGIN=verbs LMT_TEST_OPTIONS= run faults "$FAULTS"
fi

matrix

# Postcopy over verbs: the guest runs at the destination while its pages
# arrive, faults first; cancels and kills in postcopy (test_postcopy.c).
# The test catches SIGSEGV itself, so the sanitizers leave it alone.
if [ -x "$POSTCOPY" ]; then
	migrations=$((migrations + 3))
	interrupted=$((interrupted + 4))
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:intercept_tls_get_addr=0:handle_segv=0:allow_user_segv_handler=1 \
		LMT_TEST_PLUGIN=verbs LMT_TEST_OPTIONS= run postcopy "$POSTCOPY"
fi

# lmt against ib_write_bw with the same message size (chunk-size 1M) in
# rounds, each an idle guest (every byte sent once) then ib_write_bw.
round=1
while [ $round -le "$ROUNDS" ]; do
	migrations=$((migrations + 1))
	if run "bandwidth-lmt-$round" "$BENCH" --plugin verbs --ram 32M --timeout 100s --json \
		-o "channels=1,pin-all=on,chunk-size=1M"; then
		line=$(grep '"kind":"run"' /tmp/out | head -1)
		tput=$(echo "$line" | sed -n 's/.*"throughput_bps":\([0-9]*\).*/\1/p')
		band=$(echo "$line" | sed -n 's/.*"bandwidth_bps":\([0-9]*\).*/\1/p')
		say "BW lmt throughput_bps=$tput bandwidth_bps=$band"
	fi
	"$IB_WRITE_BW" -d rxe0 -i 1 -x 1 -s 1048576 -n 32 -F >/tmp/server 2>&1 &
	server=$!
	sleep 1
	if run "bandwidth-ib_write_bw-$round" "$IB_WRITE_BW" -d rxe0 -i 1 -x 1 -s 1048576 \
		-n 32 -F 127.0.0.1; then
		mbps=$(awk '$1 == 1048576 { print $4 }' /tmp/out | tail -1)
		say "BW ib_write_bw MBps=$mbps"
	fi
	wait $server
	round=$((round + 1))
done
finish
