#!/usr/bin/env bash
# packaging.debs: builds the Debian packages from this build with CPack,
# checks their metadata and contents (dpkg-deb), lintian (no errors), the
# systemd unit (systemd-analyze verify), unpacks them into a temporary root
# and there: runs the packaged imserver, builds the SDK quick start against
# the unpacked libimsdk-dev (with its CMake package, and with pkg-config
# alone) and checks it loads the unpacked library (running
# it against a server is sdk.package_consumer's part), and runs a QML test (packaged_qml.qml, qmltestrunner) on the
# unpacked qml6-module-imsdk against the same server.
# Usage: deb_test.sh BUILD_DIR QUICKSTART_SOURCE_DIR
set -euo pipefail
# grep -q quits at the first match and its writer then dies of SIGPIPE, which
# pipefail turns into a failure: read the whole input instead.
matches() { grep "$@" >/dev/null; }

build=$1
quickstart=$2
work=$(mktemp -d /tmp/imdeb-XXXXXX)
chmod 755 "$work"   # the embedded PostgreSQL runs as postgres when we are root
server_pid=""
cleanup() {
    if [ -n "$server_pid" ]; then
        kill -TERM "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }
step() { echo "== $*"; }

step "cpack -G DEB"
(cd "$build" && cpack -G DEB -B "$work/debs" >"$work/cpack.log" 2>&1) || { cat "$work/cpack.log"; fail "cpack"; }
version=$(sed -n 's/^set(CPACK_PACKAGE_VERSION "\(.*\)")$/\1/p' "$build/CPackConfig.cmake")
[ -n "$version" ] || fail "no version in CPackConfig.cmake"
arch=$(dpkg --print-architecture)
deb() { echo "$work/debs/$1_${version}-1_${arch}.deb"; }
# The SDK's own version; its package is named after the SONAME (= its MAJOR,
# docs/sdk.md "Versions").
sdkversion=$(sed -n 's/^set(PACKAGE_VERSION "\(.*\)")$/\1/p' "$build/sdk/ImSdkConfigVersion.cmake")
[ -n "$sdkversion" ] || fail "no SDK version in sdk/ImSdkConfigVersion.cmake"
so=${sdkversion%%.*}
lib=libimsdk$so
packages="imserver $lib libimsdk-dev qml6-module-imsdk imdemo"
for p in $packages; do
    [ -f "$(deb $p)" ] || { ls "$work/debs" >&2; fail "package $p not built"; }
done

step "metadata"
field() { dpkg-deb -f "$(deb "$1")" "$2"; }
for p in $packages; do
    [ "$(field $p Package)" = "$p" ] || fail "$p: Package field"
    [ "$(field $p Version)" = "${version}-1" ] || fail "$p: Version field"
    [ -n "$(field $p Maintainer)" ] || fail "$p: no Maintainer"
done
field imserver Depends | matches -F 'postgresql (>= 14)' || fail "imserver must depend on postgresql (>= 14): $(field imserver Depends)"
field imserver Depends | matches '\badduser\b' || fail "imserver must depend on adduser"
field imserver Depends | matches 'libpqxx' || fail "imserver lacks its library dependencies: $(field imserver Depends)"
field libimsdk-dev Depends | matches "$lib (= ${version}-1)" || fail "libimsdk-dev must pin $lib"
field imdemo Depends | matches "$lib" || fail "imdemo must depend on $lib"
field $lib Depends | matches "libqt6websockets6" || fail "$lib lacks its Qt dependencies: $(field $lib Depends)"
if field $lib Depends | matches 'libqt6(qml|quick)'; then fail "$lib must not need Qt Qml/Quick: $(field $lib Depends)"; fi
field qml6-module-imsdk Depends | matches "$lib (= ${version}-1)" || fail "qml6-module-imsdk must pin $lib"
field qml6-module-imsdk Depends | matches "libqt6qml6" || fail "qml6-module-imsdk lacks libqt6qml6: $(field qml6-module-imsdk Depends)"

step "contents"
contents() { dpkg-deb -c "$(deb "$1")" | awk '{print $6}' | sed 's|^\./|/|'; }
has() {
    local pkg=$1; shift
    for f in "$@"; do contents "$pkg" | matches -x -- "$f" || fail "$pkg lacks $f"; done
}
has imserver /usr/bin/imserver /lib/systemd/system/imserver.service /etc/imserver/imserver.conf \
    /usr/share/man/man8/imserver.8.gz /usr/share/man/man8/imserver-admin.8.gz \
    /usr/share/doc/imserver/copyright /usr/share/doc/imserver/operations.md.gz
has $lib "/usr/lib/libimsdk.so.$so" "/usr/lib/libimsdk.so.${sdkversion}" /usr/share/doc/$lib/copyright
has libimsdk-dev /usr/lib/libimsdk.so /usr/include/im/client.h /usr/lib/cmake/ImSdk/ImSdkConfig.cmake \
    /usr/lib/cmake/ImSdk/ImSdkTargets.cmake /usr/lib/pkgconfig/imsdk.pc
has imdemo /usr/bin/imdemo
qmldir=/usr/lib/$(dpkg-architecture -qDEB_HOST_MULTIARCH)/qt6/qml/ImSdk
has qml6-module-imsdk "$qmldir/qmldir" "$qmldir/libimsdkqml.so" "$qmldir/imsdkqml.qmltypes" \
    /usr/share/doc/qml6-module-imsdk/copyright
if contents $lib | matches '^/usr/include/'; then fail "headers belong to libimsdk-dev"; fi
dpkg-deb --ctrl-tarfile "$(deb imserver)" | tar -tf - | matches -x './conffiles' || fail "imserver has no conffiles"
dpkg-deb -I "$(deb imserver)" conffiles | matches -x /etc/imserver/imserver.conf || fail "imserver.conf is not a conffile"
dpkg-deb -I "$(deb $lib)" shlibs | matches "^libimsdk $so $lib" || fail "$lib has no shlibs"

step "lintian"
lintian --no-tag-display-limit "$work"/debs/*.deb >"$work/lintian.log" 2>&1 || true
if grep -q '^E: ' "$work/lintian.log"; then
    cat "$work/lintian.log"
    fail "lintian errors"
fi
grep -c '^W: ' "$work/lintian.log" | sed 's/^/lintian warnings: /' || true

step "unpack"
root="$work/root"
for p in $packages; do dpkg-deb -x "$(deb $p)" "$root"; done

step "systemd-analyze verify"
# verify checks that ExecStart exists and that man can open the pages of
# Documentation=: point it at the unpacked binary and manual pages.
mkdir -p "$work/unit"
sed "s|/usr/bin/imserver|$root/usr/bin/imserver|" "$root/lib/systemd/system/imserver.service" >"$work/unit/imserver.service"
MANPATH="$root/usr/share/man" systemd-analyze verify "$work/unit/imserver.service" >"$work/verify.log" 2>&1 || { cat "$work/verify.log"; fail "systemd-analyze verify"; }
if grep -v -e 'Failed to open /dev/tty' "$work/verify.log" | matches .; then cat "$work/verify.log"; fail "systemd-analyze verify complained"; fi
for key in 'User=imserver' 'NoNewPrivileges=yes' 'ProtectSystem=strict' 'ReadWritePaths=/var/lib/imserver' \
           'PrivateTmp=yes' 'Restart=on-failure' 'KillSignal=SIGTERM' 'ExecReload=/bin/kill -HUP $MAINPID'; do
    grep -qx "$key" "$root/lib/systemd/system/imserver.service" || fail "unit lacks $key"
done
stop=$(sed -n 's/^TimeoutStopSec=//p' "$root/lib/systemd/system/imserver.service")
drain_ms=$(IM_CONFIG= "$root/usr/bin/imserver" --config "$root/etc/imserver/imserver.conf" --print-config |
           sed -n 's/^drain-timeout-ms = \([0-9]*\).*/\1/p')
[ "$((stop * 1000))" -gt "$drain_ms" ] || fail "TimeoutStopSec=$stop must exceed the drain ($drain_ms ms)"

step "packaged config and man pages"
"$root/usr/bin/imserver" --config "$root/etc/imserver/imserver.conf" --print-config >"$work/print.txt"
grep -q '^state-dir = /var/lib/imserver ' "$work/print.txt" || { cat "$work/print.txt"; fail "default config"; }
for page in imserver imserver-admin; do
    MANWIDTH=80 man --warnings -l "$root/usr/share/man/man8/$page.8.gz" >"$work/$page.txt" 2>"$work/man.err" ||
        fail "man $page"
    [ ! -s "$work/man.err" ] || { cat "$work/man.err"; fail "man $page warnings"; }
    grep -q -- '--state-dir' "$work/$page.txt" || fail "$page(8) lacks --state-dir"
done

step "packaged imserver serves"
state="$work/state"
mkdir -p "$state"
chmod 755 "$state"
"$root/usr/bin/imserver" --config '' --state-dir "$state" --listen 127.0.0.1:0 --ready-file "$work/port" --quiet \
    2>"$work/server.log" &
server_pid=$!
for _ in $(seq 1 600); do
    [ -s "$work/port" ] && break
    kill -0 "$server_pid" 2>/dev/null || { cat "$work/server.log"; fail "imserver exited"; }
    sleep 0.1
done
[ -s "$work/port" ] || { cat "$work/server.log"; fail "imserver did not get ready"; }
port=$(cat "$work/port")
"$root/usr/bin/imserver" admin --config '' --state-dir "$state" demo --out "$work/tokens.json" >/dev/null

step "quick start against the unpacked libimsdk-dev"
cmake -S "$quickstart" -B "$work/qs" -DCMAKE_PREFIX_PATH="$root/usr" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_FIND_PACKAGE_NO_SYSTEM_PACKAGE_REGISTRY=ON >"$work/qs.log" 2>&1 || { cat "$work/qs.log"; fail "configure"; }
grep -q "ImSdk_DIR:PATH=$root/usr/lib/cmake/ImSdk" "$work/qs/CMakeCache.txt" || fail "did not find the unpacked ImSdk"
cmake --build "$work/qs" >>"$work/qs.log" 2>&1 || { cat "$work/qs.log"; fail "build"; }
ldd "$work/qs/mychat" | matches "libimsdk.so.$so => $root/usr/lib/libimsdk.so.$so" ||
    { ldd "$work/qs/mychat"; fail "mychat does not load the unpacked libimsdk.so.$so"; }
# Without CMake: pkg-config alone (imsdk.pc is relocatable: the unpacked
# root works as well as /usr).
pcflags=$(PKG_CONFIG_PATH="$root/usr/lib/pkgconfig" pkg-config --cflags --libs imsdk) || fail "pkg-config imsdk"
c++ -std=c++17 -fPIC "$quickstart/main.cpp" $pcflags -o "$work/mychat-pc" >"$work/pc.log" 2>&1 ||
    { cat "$work/pc.log"; fail "the quick start does not build with pkg-config ($pcflags)"; }
LD_LIBRARY_PATH="$root/usr/lib" ldd "$work/mychat-pc" | matches "libimsdk.so.$so => $root/usr/lib/libimsdk.so.$so" ||
    fail "the pkg-config build does not link libimsdk.so.$so"
# Running the quick start against a server is sdk.package_consumer's job (the
# same program from the same install components); here it must build and
# load the unpacked library, which is what the package adds.

step "import ImSdk from the unpacked qml6-module-imsdk"
LD_LIBRARY_PATH="$root/usr/lib" ldd "$root$qmldir/libimsdkqml.so" | matches "libimsdk.so.$so => $root/usr/lib/libimsdk.so.$so" ||
    fail "the QML plugin does not link libimsdk.so.$so"
qml_token=$("$root/usr/bin/imserver" admin --config '' --state-dir "$state" device add ana ana-qml)
sed -e "s|@URL@|ws://127.0.0.1:$port/v1/ws|" -e "s|@TOKEN@|$qml_token|" -e "s|@DB@|$work/qml.db|" \
    "$(dirname "$0")/packaged_qml.qml" >"$work/tst_packaged.qml"
HOME="$work/home" LD_LIBRARY_PATH="$root/usr/lib" QT_QPA_PLATFORM=offscreen QT_QUICK_BACKEND=software \
    timeout 180 /usr/lib/qt6/bin/qmltestrunner -import "$root$(dirname "$qmldir")" -input "$work/tst_packaged.qml" \
    >"$work/qml.out" 2>&1 || { cat "$work/qml.out"; fail "the packaged QML module did not send"; }

kill -TERM "$server_pid"
wait "$server_pid" || fail "imserver did not drain cleanly"
server_pid=""
echo "packages build, pass lintian and systemd-analyze, the quick start builds against them and the QML module runs"
