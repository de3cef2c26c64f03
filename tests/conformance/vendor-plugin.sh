#!/bin/sh
# Builds the out-of-tree example plugin the way a vendor would: against a
# staging install of lmt alone (pkg-config, no path into lmt's tree), then
# migrates with it through LMT_PLUGIN_PATH and runs lmt-plugin-check on it.
# usage: vendor-plugin.sh BUILD_DIR EXAMPLE_DIR SOURCE_ROOT MESON NINJA
set -eu

build=$1 example=$2 source_root=$3 meson=$4 ninja=$5
for tool in pkg-config cc; do
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
bench=$(find "$stage" -type f -name lmt-bench | head -n 1)
check=$(find "$stage" -type f -name lmt-plugin-check | head -n 1)
liblmt=$(find "$stage" -name 'liblmt.so.0' | head -n 1)
if [ -z "$pcfile" ] || [ -z "$bench" ] || [ -z "$check" ] || [ -z "$liblmt" ]; then
	fail "the staging install lacks lmt-plugin.pc, lmt-bench, lmt-plugin-check or liblmt"
fi

# pkg-config sees the staging tree alone, as a sysroot.
PKG_CONFIG_LIBDIR=$(dirname "$pcfile")
PKG_CONFIG_PATH=$PKG_CONFIG_LIBDIR
PKG_CONFIG_SYSROOT_DIR=$stage
export PKG_CONFIG_LIBDIR PKG_CONFIG_PATH PKG_CONFIG_SYSROOT_DIR
plugindir=$(pkg-config --variable=plugindir lmt-plugin)
echo "cflags: $(pkg-config --cflags lmt-plugin)"
echo "plugindir: $plugindir"

step "build the example out of tree"
cp -R "$example" "$tmp/src"
"$meson" setup "$tmp/build" "$tmp/src" -Dwerror=true
"$ninja" -C "$tmp/build"
name=$(basename "$(find "$tmp/build" -maxdepth 1 -name '*.so' | head -n 1)" .so)
[ -n "$name" ] || fail "the example built no plugin"
if grep -F -e "$source_root" -e "$build" "$tmp/build/compile_commands.json"; then
	fail "the example's build reaches into lmt's tree"
fi

LD_LIBRARY_PATH=$(dirname "$liblmt")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export LD_LIBRARY_PATH

step "migrate with '$name' found through LMT_PLUGIN_PATH"
LMT_PLUGIN_PATH=$tmp/build "$bench" --plugin "$name" --ram 64M --dirty-rate 32M ||
	fail "lmt-bench over '$name'"

step "lmt-plugin-check $name"
LMT_PLUGIN_PATH=$tmp/build "$check" "$name" || fail "lmt-plugin-check $name"

step "install '$name' next to the staged plugins and load it from there"
"$meson" install -C "$tmp/build" --no-rebuild --quiet
[ -f "$plugindir/$name.so" ] || fail "$name.so is not in $plugindir"
out=$(env -u LMT_PLUGIN_PATH "$check" "$name" --check descriptor) ||
	fail "lmt-plugin-check $name from $plugindir: $out"
echo "$out"
echo "$out" | grep -q "^PASS  load: $plugindir/$name.so\$" ||
	fail "'$name' was not loaded from $plugindir"
echo "PASS"
