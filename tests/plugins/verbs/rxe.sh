#!/bin/sh
# The rxe suite: boots a Debian kernel under qemu (TCG) with an initramfs that
# carries lmt's binaries, creates a soft-RoCE device and runs rxe-init.sh there.
#   rxe.sh BUILD_ROOT SOURCE_DIR [SANITIZE]
# Exit 77 (skipped) only when qemu or the kernel package cannot be had.
# TCG even where /dev/kvm is present: nested KVM did not boot this guest on
# the virtual machines CI runs on (docs/verbs.md).
set -eu
PATH=$PATH:/usr/sbin:/sbin
build=$(cd "${1:?usage: rxe.sh BUILD_ROOT SOURCE_DIR [SANITIZE]}" && pwd)
here=$(cd "${2:?source dir}" && pwd)
sanitize=${3:-none}
cache=${LMT_RXE_CACHE:-$build/rxe-cache}
arch=$(dpkg --print-architecture 2>/dev/null || echo unknown)
start=$(date +%s)

skip() {
	echo "rxe: SKIPPED: $*"
	exit 77
}
die() {
	echo "rxe: ERROR: $*" >&2
	exit 1
}

[ "$arch" = amd64 ] || skip "the rxe suite boots an amd64 Debian kernel; this is $arch"
qemu=$(command -v qemu-system-x86_64 || true)
[ -n "$qemu" ] || skip "qemu-system-x86_64 not found (apt-get install qemu-system-x86)"
for tool in busybox cpio modinfo rdma ip xz dpkg-deb ib_write_bw; do
	command -v "$tool" >/dev/null 2>&1 ||
		die "$tool not found: run scripts/setup-debian (busybox-static, cpio, kmod," \
		    "iproute2, xz-utils, perftest)"
done
busybox=$(command -v busybox)
ldd "$busybox" >/dev/null 2>&1 && die "$busybox is dynamically linked: install busybox-static"

# ---- The kernel: downloaded once into the cache, modules resolved there ----
mkdir -p "$cache"
kernel_ready() {
	[ -s "$cache/kernel/vmlinux" ] || [ -s "$cache/kernel/vmlinuz" ] || return 1
	[ -s "$cache/kernel/modules.order" ]
}

# Decompress the kernel image (its xz or gzip payload) to a bootable ELF
# vmlinux: TCG reaches /init in about a third of the time without the
# in-guest decompression.
extract_vmlinux() {
	for magic in '\xfd7zXZ\x00:xz' '\x1f\x8b\x08:gzip'; do
		for off in $(LC_ALL=C grep -obUaP "${magic%:*}" "$1" | cut -d: -f1 | head -3); do
			tail -c +$((off + 1)) "$1" | "${magic#*:}" -dc >"$2" 2>/dev/null || true
			if [ "$(head -c 4 "$2" | od -An -tx1 | tr -d ' \n')" = 7f454c46 ]; then
				return 0
			fi
		done
	done
	rm -f "$2"
	return 1
}

fetch_kernel() {
	tmp="$cache/tmp.$$"
	rm -rf "$tmp" "$cache/kernel"
	mkdir -p "$tmp"
	deb=${LMT_RXE_KERNEL_DEB:-}
	if [ -z "$deb" ]; then
		pkg=$(apt-cache depends linux-image-amd64 2>/dev/null |
			sed -n 's/^ *Depends: \(linux-image-6\.1\.[0-9]*-[0-9]*-amd64\)$/\1/p' | head -1)
		[ -n "$pkg" ] || pkg=$(apt-cache search --names-only \
			'^linux-image-6\.1\.[0-9]+-[0-9]+-amd64$' 2>/dev/null | cut -d' ' -f1 |
			sort -V | tail -1)
		[ -n "$pkg" ] || { rm -rf "$tmp"; skip "no linux-image-6.1.0-*-amd64 package" \
			"known to apt (run apt-get update)"; }
		echo "rxe: downloading $pkg into $cache"
		(cd "$tmp" && apt-get download "$pkg" >"$tmp/apt.log" 2>&1) || {
			tail -3 "$tmp/apt.log"
			rm -rf "$tmp"
			skip "apt-get download $pkg failed"
		}
		deb=$(ls "$tmp"/*.deb)
	fi
	dpkg -x "$deb" "$tmp/x" || die "dpkg -x $deb failed"
	kver=$(ls "$tmp/x/lib/modules" | head -1)
	mods="$tmp/x/lib/modules/$kver/kernel"
	[ -d "$mods" ] || die "$deb has no modules"
	mkdir -p "$tmp/kernel/modules"
	# Load order: each module after what it depends on. crc32_generic is
	# not declared by rdma_rxe, yet rxe needs it.
	: >"$tmp/kernel/modules.order"
	add_module() {
		local file deps d
		grep -qx "$1" "$tmp/kernel/modules.order" && return 0
		file=$(find "$mods" -name "$1.ko" -o -name "$1.ko.xz" | head -1)
		if [ -z "$file" ]; then
			echo "rxe: note: module $1 not found, assuming it is built in"
			return 0
		fi
		deps=$(modinfo -F depends "$file" | tr ',' ' ')
		for d in $deps; do
			add_module "$d"
		done
		case $file in
		*.xz) xz -dc "$file" >"$tmp/kernel/modules/$1.ko" ;;
		*) cp "$file" "$tmp/kernel/modules/$1.ko" ;;
		esac
		echo "$1" >>"$tmp/kernel/modules.order"
	}
	for m in virtio_pci virtio_net crc32_generic udp_tunnel ip6_udp_tunnel ib_core \
	         ib_uverbs rdma_rxe; do
		add_module "$m"
	done
	if ! extract_vmlinux "$tmp/x/boot/vmlinuz-$kver" "$tmp/kernel/vmlinux"; then
		echo "rxe: cannot decompress vmlinuz-$kver; booting the compressed image"
		cp "$tmp/x/boot/vmlinuz-$kver" "$tmp/kernel/vmlinuz"
	fi
	echo "$kver" >"$tmp/kernel/version"
	mv "$tmp/kernel" "$cache/kernel"
	rm -rf "$tmp"
}

kernel_ready || fetch_kernel
echo "rxe: kernel $(cat "$cache/kernel/version") from $cache ($(($(date +%s) - start)) s)"

# ---- The initramfs: busybox, lmt's binaries and every library they load ----
stage="$build/rxe-initramfs"
rm -rf "$stage"
mkdir -p "$stage/bin" "$stage/dev" "$stage/proc" "$stage/sys" "$stage/tmp" \
	"$stage/lmt/modules" "$stage/etc/libibverbs.d" "$stage/run"

# Copy a file to the same absolute path in the guest.
add_file() {
	[ -e "$stage$1" ] && return 0
	mkdir -p "$stage$(dirname "$1")"
	cp -L "$1" "$stage$1"
}

# A binary or library and everything ldd says it needs.
add_elf() {
	add_file "$1"
	ldd "$1" 2>/dev/null | awk '/=> \// { print $3 } /^[ \t]*\// { print $1 }' |
	while read -r lib; do
		add_file "$lib"
	done
}

bench="$build/tools/lmt-bench"
check="$build/tools/plugin-check/lmt-plugin-check"
faults="$build/tests/integration/test_faults"
postcopy="$build/tests/integration/test_postcopy"
matrix="$build/tests/integration/test_fault_matrix"
chaos="$build/plugins/chaos/chaos.so"
plugin="$build/plugins/verbs/verbs.so"
for f in "$bench" "$check" "$plugin" "$build/tests/plugins/verbs/verbs-probe"; do
	[ -x "$f" ] || [ -f "$f" ] || die "$f not built (meson compile first)"
done
cp "$busybox" "$stage/bin/busybox"
for f in "$bench" "$check" "$plugin" "$build/tests/plugins/verbs/verbs-probe" \
         "$(command -v rdma)" "$(command -v ip)" "$(command -v ib_write_bw)"; do
	add_elf "$f"
done
[ -x "$faults" ] && add_elf "$faults"
[ -x "$postcopy" ] && add_elf "$postcopy"
if [ -x "$matrix" ] && [ -f "$chaos" ]; then
	add_elf "$matrix"
	add_elf "$chaos"
fi
provider=$(ls /usr/lib/*-linux-gnu/libibverbs/librxe-rdmav*.so 2>/dev/null | head -1)
[ -n "$provider" ] || die "librxe-rdmav*.so not found: install ibverbs-providers"
add_elf "$provider"
add_file /etc/libibverbs.d/rxe.driver
cp "$cache/kernel/modules/"*.ko "$stage/lmt/modules/"
cp "$cache/kernel/modules.order" "$stage/lmt/modules.order"
cp "$here/rxe-init.sh" "$stage/init"
chmod +x "$stage/init"
cat >"$stage/lmt/env" <<ENV
BENCH='$bench'
CHECK='$check'
FAULTS='$faults'
POSTCOPY='$postcopy'
MATRIX='$matrix'
MATRIX_RUNS='${LMT_RXE_MATRIX_RUNS:-1}'
ONLY_MATRIX='${LMT_RXE_ONLY_MATRIX:-0}'
MATRIX_OPTIONS='${LMT_TEST_MATRIX_OPTIONS:-}'
MATRIX_CELL='${LMT_TEST_CELL:-}'
CHAOS_DIR='$(dirname "$chaos")'
PROBE='$build/tests/plugins/verbs/verbs-probe'
PLUGIN_DIR='$(dirname "$plugin")'
RDMA='$(command -v rdma)'
IP='$(command -v ip)'
IB_WRITE_BW='$(command -v ib_write_bw)'
SANITIZE='$sanitize'
ENV
# Sanitized binaries run several times slower under TCG: a smaller guest
# and one bandwidth round keep the suite within its time limit.
if [ "$sanitize" = none ]; then
	echo "RAM=32M DIRTY=8M ROUNDS=3" >>"$stage/lmt/env"
else
	echo "RAM=16M DIRTY=4M ROUNDS=1" >>"$stage/lmt/env"
fi
initrd="$build/rxe-initramfs.cpio"
(cd "$stage" && find . | cpio -o -H newc --quiet) >"$initrd"
echo "rxe: initramfs $(($(wc -c <"$initrd") / 1048576)) MiB ($(($(date +%s) - start)) s)"

# ---- Boot ----
if [ -s "$cache/kernel/vmlinux" ]; then
	kernel="$cache/kernel/vmlinux"
else
	kernel="$cache/kernel/vmlinuz"
fi
log="$build/rxe-console.log"
echo "rxe: booting $kernel under TCG; console in $log"
boot=$(date +%s)
set +e
timeout "${LMT_RXE_TIMEOUT:-330}" "$qemu" -accel tcg -M pc -cpu max -smp 2 -m 1536 \
	-nodefaults -no-reboot -display none -monitor none -serial stdio \
	-kernel "$kernel" -initrd "$initrd" \
	-append "console=ttyS0 panic=-1 quiet mitigations=off nokaslr" \
	-netdev user,id=n0,restrict=on -device virtio-net-pci,netdev=n0 \
	</dev/null >"$log" 2>&1
qrc=$?
set -e
end=$(date +%s)
tr -d '\r' <"$log" | grep '^lmt-rxe:' || true
[ $qrc -eq 124 ] && die "qemu timed out after ${LMT_RXE_TIMEOUT:-330} s; see $log"
[ $qrc -eq 0 ] || { tail -40 "$log"; die "qemu exited with $qrc"; }

result=$(tr -d '\r' <"$log" | sed -n 's/^lmt-rxe: RESULT //p' | tail -1)
[ -n "$result" ] || { tail -60 "$log"; die "the guest stopped before reporting; see $log"; }
passed=$(echo "$result" | sed -n 's/.*passed=\([0-9]*\).*/\1/p')
failed=$(echo "$result" | sed -n 's/.*failed=\([0-9]*\).*/\1/p')
migrations=$(echo "$result" | sed -n 's/.*migrations=\([0-9]*\).*/\1/p')
interrupted=$(echo "$result" | sed -n 's/.*interrupted=\([0-9]*\).*/\1/p')
echo "rxe: guest completed $migrations migrations over verbs (and ${interrupted:-0} killed" \
	"or cancelled on purpose); boot and run $((end - boot)) s, wall time $((end - start)) s"
# lmt over verbs against ib_write_bw, same message size, same guest: the
# median of the rounds' ratios.
tr -d '\r' <"$log" | awk '
	/^lmt-rxe: BW lmt / {
		sub(/.*throughput_bps=/, ""); split($0, f, " bandwidth_bps=")
		tput[++nl] = f[1]; band[nl] = f[2]
	}
	/^lmt-rxe: BW ib_write_bw MBps=/ { sub(/.*MBps=/, ""); ib[++ni] = $0 * 1048576 }
	function median(a, n,    i, j, t) {
		for (i = 1; i <= n; i++)
			for (j = i + 1; j <= n; j++)
				if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
		return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
	}
	END {
		n = nl < ni ? nl : ni
		if (n == 0 || ib[1] == 0)
			exit
		for (i = 1; i <= n; i++) {
			rb[i] = band[i] / ib[i]; rt[i] = tput[i] / ib[i]
			printf "rxe: round %d: ib_write_bw %.1f MiB/s, lmt pass bandwidth %.1f MiB/s" \
			       " (%.2f), lmt whole-migration throughput %.1f MiB/s (%.2f)\n",
			       i, ib[i] / 1048576, band[i] / 1048576, rb[i], tput[i] / 1048576, rt[i]
		}
		printf "rxe: lmt/ib_write_bw with 1 MiB writes, median of %d: %.2f (pass" \
		       " bandwidth), %.2f (whole migration)\n", n, median(rb, n), median(rt, n)
	}'
if [ "${failed:-1}" -ne 0 ] || [ "${passed:-0}" -eq 0 ]; then
	tr -d '\r' <"$log" | tail -80
	echo "${passed:-0} passed, ${failed:-?} failed"
	exit 1
fi
echo "${passed} passed, 0 failed"
