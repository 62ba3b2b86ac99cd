#!/usr/bin/env bash
# An installed softverbs, as a user's project meets it (docs/install.md):
#   1. `cmake --install BUILD --prefix P` lays out the private library directory,
#      the launcher, the headers, the CMake package and softverbs.pc;
#   2. a separate CMake project (tests/package/consumer) finds it with
#      find_package(softverbs CONFIG REQUIRED), registers its tests with
#      softverbs_add_test (DEVICES, FAULTS, ENVIRONMENT), builds, and its ctest passes
#      (a C program, the control API, and a GoogleTest suite on <softverbs/testing.hpp>);
#   3. pkg-config answers from P's softverbs.pc;
#   4. the prefix still works after it is moved (the launcher and the .pc file are
#      relative to their own location);
#   5. `cpack -G DEB` makes a package whose files stay out of rdma-core's paths.
# Usage: package_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

prefix=$work/opt/softverbs
cmake --install "$build" --prefix "$prefix" >"$work/install.log"
for f in lib/softverbs/libibverbs.so.1 lib/softverbs/librdmacm.so.1 lib/softverbs/librspreload.so bin/softverbs include/softverbs/faults.h include/softverbs/faults.hpp include/softverbs/testing.hpp \
         lib/cmake/softverbs/softverbsConfig.cmake lib/cmake/softverbs/softverbsConfigVersion.cmake \
         lib/pkgconfig/softverbs.pc; do
  [ -e "$prefix/$f" ] || fail "not installed: $f"
done
# The drop-in libraries are only in the private directory, and the installed
# librdmacm.so.1 finds the libibverbs.so.1 beside it (run path $ORIGIN).
stray=$(find "$prefix" \( -name 'libibverbs*' -o -name 'librdmacm*' \) ! -path "$prefix/lib/softverbs/*")
[ -z "$stray" ] || fail "libibverbs or librdmacm outside lib/softverbs: $stray"
runpath=$(readelf -d "$prefix/lib/softverbs/librdmacm.so.1" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]/\1/p')
[ "$runpath" = '$ORIGIN' ] || fail "the installed librdmacm.so.1's run path: '$runpath'"
deps=$(env -u LD_LIBRARY_PATH ldd "$prefix/lib/softverbs/librdmacm.so.1")
grep -q "libibverbs.so.1 => $prefix/lib/softverbs/libibverbs.so.1" <<<"$deps" ||
  fail "the installed librdmacm.so.1 does not load the libibverbs.so.1 beside it: $deps"

consumer=$work/consumer
cmake -S "$src/tests/package/consumer" -B "$consumer" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >"$work/configure.log" 2>&1 ||
  { cat "$work/configure.log"; fail "the consumer project does not configure"; }
cmake --build "$consumer" >"$work/build.log" 2>&1 || { cat "$work/build.log"; fail "the consumer project does not build"; }
(cd "$consumer" && ctest --output-on-failure) || fail "the consumer project's tests fail"

version=$(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --modversion softverbs)
[ "$version" = "$(sed -n 's/^project(softverbs VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")" ] ||
  fail "pkg-config --modversion softverbs: '$version'"
cflags=$(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags softverbs)
inc=${cflags#-I}; inc=${inc%% *}
[ -f "$inc/softverbs/faults.h" ] || fail "pkg-config --cflags softverbs: '$cflags'"

moved=$work/elsewhere
mv "$work/opt/softverbs" "$moved"
[ "$("$moved/bin/softverbs" libdir)" = "$moved/lib/softverbs" ] || fail "the moved launcher's libdir: $("$moved/bin/softverbs" libdir)"
SOFTVERBS_DEVICES=2 "$moved/bin/softverbs" run -- "$consumer/devcheck" 2 || fail "devcheck through the moved launcher"
# Output into a variable first: with pipefail, `ldd | grep -q` fails whenever grep's
# early exit makes ldd's next write meet SIGPIPE.
deps=$(env -u LD_LIBRARY_PATH ldd "$moved/lib/softverbs/librdmacm.so.1")
grep -q "libibverbs.so.1 => $moved/lib/softverbs/libibverbs.so.1" <<<"$deps" ||
  fail "the moved librdmacm.so.1 does not load the libibverbs.so.1 beside it: $deps"
ln -s "$moved/bin/softverbs" "$work/softverbs-link"
[ "$("$work/softverbs-link" libdir)" = "$moved/lib/softverbs" ] || fail "a symlink to the launcher"
cflags=$(PKG_CONFIG_PATH="$moved/lib/pkgconfig" pkg-config --cflags softverbs)
inc=${cflags#-I}; inc=${inc%% *}
[ -f "$inc/softverbs/faults.h" ] || fail "pkg-config of the moved prefix: '$cflags'"

cpack --config "$build/CPackConfig.cmake" -B "$work/deb" >"$work/cpack.log" 2>&1 || { cat "$work/cpack.log"; fail "cpack"; }
deb=$(ls "$work"/deb/softverbs_*.deb)
dpkg-deb -c "$deb" | awk '{print $NF}' > "$work/files"
grep -qx './usr/lib/softverbs/libibverbs.so.1' "$work/files" || fail "the .deb lacks /usr/lib/softverbs/libibverbs.so.1"
grep -qx './usr/lib/softverbs/librdmacm.so.1' "$work/files" || fail "the .deb lacks /usr/lib/softverbs/librdmacm.so.1"
grep -qx './usr/bin/softverbs' "$work/files" || fail "the .deb lacks /usr/bin/softverbs"
if grep -E '^\./(usr/)?lib/x86_64-linux-gnu/|^\./usr/lib/lib(ibverbs|rdmacm)' "$work/files"; then fail "the .deb has files on the loader's path"; fi
depends=$(dpkg-deb -f "$deb" Depends)
grep -q libisal2 <<<"$depends" || fail "the .deb does not depend on libisal2: $depends"
echo "package: installed, consumed with find_package and pkg-config, relocated, packaged ($(basename "$deb"))"
