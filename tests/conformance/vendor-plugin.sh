#!/bin/sh
# Checks a staging install of lmt the way its users meet it. The installed
# lmt-info, lmt-bench and lmt-plugin-check, and a program built with
# `pkg-config --cflags --libs lmt`, run and find the staged liblmt by their
# run paths alone (no LD_LIBRARY_PATH). Then the out-of-tree example plugin
# is built the way a vendor would: against the staging install alone
# (pkg-config, no path into lmt's tree), migrated with through
# LMT_PLUGIN_PATH, and run through lmt-plugin-check.
# usage: vendor-plugin.sh BUILD_DIR EXAMPLE_DIR SOURCE_ROOT MESON NINJA [SANITIZE]
# SANITIZE is the build's b_sanitize (none, or e.g. address,undefined): the
# program is built with the same sanitizers as the liblmt it links.
set -eu

build=$1 example=$2 source_root=$3 meson=$4 ninja=$5 sanitize=${6:-none}
for tool in pkg-config cc ldd; do
	command -v "$tool" >/dev/null || { echo "SKIP: no $tool"; exit 77; }
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/lmt-vendor.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM
stage=$tmp/stage

step() { printf '\n== %s\n' "$*"; }
fail() { echo "FAIL: $*"; exit 1; }

step "install lmt into $stage"
"$meson" install -C "$build" --destdir "$stage" --no-rebuild --quiet
pcfile=$(find "$stage" -name lmt-plugin.pc | head -n 1)
info=$(find "$stage" -type f -name lmt-info | head -n 1)
bench=$(find "$stage" -type f -name lmt-bench | head -n 1)
check=$(find "$stage" -type f -name lmt-plugin-check | head -n 1)
liblmt=$(find "$stage" -name 'liblmt.so.0' | head -n 1)
if [ -z "$pcfile" ] || [ -z "$info" ] || [ -z "$bench" ] || [ -z "$check" ] ||
	[ -z "$liblmt" ]; then
	fail "the staging install lacks lmt-plugin.pc, lmt-info, lmt-bench, lmt-plugin-check" \
		"or liblmt"
fi

# pkg-config sees the staging tree alone, as a sysroot.
PKG_CONFIG_LIBDIR=$(dirname "$pcfile")
PKG_CONFIG_PATH=$PKG_CONFIG_LIBDIR
PKG_CONFIG_SYSROOT_DIR=$stage
export PKG_CONFIG_LIBDIR PKG_CONFIG_PATH PKG_CONFIG_SYSROOT_DIR
plugindir=$(pkg-config --variable=plugindir lmt-plugin)
echo "cflags: $(pkg-config --cflags lmt-plugin)"
echo "plugindir: $plugindir"

# Installed under a prefix other than /usr, programs carry run paths (see
# README.md, "Embedding lmt in a VMM"). Under /usr they carry none, by
# design: the loader finds a real /usr install by itself, and this stage
# only through LD_LIBRARY_PATH.
prefix=$(env -u PKG_CONFIG_SYSROOT_DIR pkg-config --variable=prefix lmt)
if [ "$prefix" = /usr ]; then
	LD_LIBRARY_PATH=$(dirname "$liblmt")
	export LD_LIBRARY_PATH
else
	unset LD_LIBRARY_PATH
fi

# PROGRAM loads liblmt from the stage, not from a copy elsewhere.
uses_staged_liblmt() {
	found=$(ldd "$1" | sed -n -e 's/^[[:space:]]*liblmt\.so\.0 => \(.*\) (0x[0-9a-f]*)$/\1/p' \
		-e 's/^[[:space:]]*liblmt\.so\.0 => \(not found\)$/\1/p')
	case $found in
	"$stage"/*) echo "$(basename "$1"): liblmt from $found" ;;
	*) fail "$(basename "$1") does not find the staged liblmt (${found:-not found})" ;;
	esac
}

step "the installed programs run from $prefix"
for program in "$info" "$bench" "$check"; do
	uses_staged_liblmt "$program"
done
"$info" --options >"$tmp/options" || fail "lmt-info --options"
grep -q '^  chunk-size ' "$tmp/options" || fail "lmt-info --options does not list chunk-size"
"$bench" --plugin tcp --ram 16M || fail "lmt-bench --plugin tcp --ram 16M"

step "a program built with pkg-config --cflags --libs lmt"
# What pkg-config gives for lmt installed in the staged prefix itself.
flags=$(env -u PKG_CONFIG_SYSROOT_DIR pkg-config --define-variable=prefix="$stage$prefix" \
	--cflags --libs lmt)
case $sanitize in
none | '') ;;
*) flags="-fsanitize=$sanitize $flags" ;;
esac
echo "flags: $flags"
cat >"$tmp/embed.c" <<'PROGRAM'
#include <stdio.h>
#include <string.h>

#include <lmt/lmt.h>

int main(void)
{
	struct lmt_error err = {0};
	lmt_plugin_handle *tcp = NULL;

	if (strcmp(lmt_version(), LMT_VERSION) != 0 || lmt_plugin_open("tcp", &tcp, &err) != 0) {
		fprintf(stderr, "lmt %s (built with %s): %s\n", lmt_version(), LMT_VERSION,
		        err.message);
		return 1;
	}
	printf("lmt %s, tcp plugin at %s\n", lmt_version(), lmt_plugin_path(tcp));
	lmt_plugin_close(tcp);
	return 0;
}
PROGRAM
# shellcheck disable=SC2086 # the flags are words
cc -o "$tmp/embed" "$tmp/embed.c" $flags || fail "the program does not build"
uses_staged_liblmt "$tmp/embed"
"$tmp/embed" || fail "the program built with pkg-config does not run"

step "build the example out of tree"
cp -R "$example" "$tmp/src"
"$meson" setup "$tmp/build" "$tmp/src" -Dwerror=true
"$ninja" -C "$tmp/build"
name=$(basename "$(find "$tmp/build" -maxdepth 1 -name '*.so' | head -n 1)" .so)
[ -n "$name" ] || fail "the example built no plugin"
if grep -F -e "$source_root" -e "$build" "$tmp/build/compile_commands.json"; then
	fail "the example's build reaches into lmt's tree"
fi

step "migrate with '$name' found through LMT_PLUGIN_PATH"
LMT_PLUGIN_PATH=$tmp/build "$bench" --plugin "$name" --ram 64M --dirty-rate 32M ||
	fail "lmt-bench over '$name'"

step "lmt-plugin-check $name"
# The cma example writes straight into the destination process's memory
# (process_vm_writev): no link breaks when the destination closes its
# endpoints, so its source cannot learn of it, and the reopen check's
# second case must fail there (it forgets a closed channel's completions).
expect=
[ "$name" = cma ] && expect="reopen=cma: no link breaks when the destination closes its endpoints, so the source cannot learn of it"
LMT_PLUGIN_PATH=$tmp/build "$check" ${expect:+--expect-fail "$expect"} "$name" ||
	fail "lmt-plugin-check $name"

step "install '$name' next to the staged plugins and load it from there"
"$meson" install -C "$tmp/build" --no-rebuild --quiet
[ -f "$plugindir/$name.so" ] || fail "$name.so is not in $plugindir"
out=$(env -u LMT_PLUGIN_PATH "$check" "$name" --check descriptor) ||
	fail "lmt-plugin-check $name from $plugindir: $out"
echo "$out"
echo "$out" | grep -q "^PASS  load: $plugindir/$name.so\$" ||
	fail "'$name' was not loaded from $plugindir"
echo "PASS"
