#!/bin/sh
# The hw suite: the verbs plugin between two processes on a real RDMA device
# (InfiniBand or RoCE), pin-all on and off, two channels, bit-exact. Skipped,
# with the reason, when ibv_get_device_list finds no device with an active port.
#   hw.sh VERBS_PROBE LMT_BENCH
set -u
probe=$1
bench=$2
"$probe"
rc=$?
[ $rc -eq 77 ] && exit 77
[ $rc -eq 0 ] || { echo "verbs-probe failed ($rc)"; exit 1; }
passed=0
failed=0
for opts in channels=1,pin-all=on channels=1,pin-all=off channels=2,pin-all=on \
            channels=2,pin-all=off; do
	if "$bench" --plugin verbs --ram 256M --dirty-rate 64M --timeout 100s \
		-o "verify=on,$opts${LMT_HW_OPTIONS:+,$LMT_HW_OPTIONS}"; then
		passed=$((passed + 1))
	else
		failed=$((failed + 1))
	fi
done
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
