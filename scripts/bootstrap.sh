#!/bin/sh
# bootstrap: install what the build needs (Debian/Ubuntu -dev packages through apt-get, only
# those missing, so running it again does nothing), then run `make TARGET...`.
#   scripts/bootstrap.sh run     build and run moeserve on the built-in tiny model
#   scripts/bootstrap.sh test    build and run the tests (what CI runs)
#   scripts/bootstrap.sh fuzz    the libFuzzer harnesses (clang, its runtimes and OpenMP: only then)
set -eu
cd "$(dirname "$0")/.."
PKGS="gcc make pkg-config libjansson-dev libpcre2-dev libutf8proc-dev libmicrohttpd-dev libcurl4-openssl-dev libgomp1 libopenmpi-dev openmpi-bin"
case " $* " in *" fuzz "*) PKGS="$PKGS clang libclang-rt-dev libomp-dev" ;; esac
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO=sudo
    echo "bootstrap: installing$missing"
    $SUDO apt-get update
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends $missing
fi
exec make -j"$(nproc 2>/dev/null || echo 2)" "$@"
