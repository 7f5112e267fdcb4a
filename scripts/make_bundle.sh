#!/usr/bin/env bash
# Pack BCC and kernel headers for a GPU host that reaches no package registry.
#   scripts/make_bundle.sh [OUT_DIR]     # default .bundle/ ; writes clockalign-bcc-bundle.tar.xz
# Contents (Debian bookworm, x86-64): libbpfcc, python3-bpfcc, libclang-cpp14, libllvm14,
# libz3-4, libedit2, libbpf1, libelf1, the newest linux-headers-*-amd64 and its -common tree,
# docs stripped; plus wheels of the Python packages clockalign needs that such hosts may lack.
# Install on the target with scripts/install_bundle.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-.bundle}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
apt-get update -qq >/dev/null 2>&1 || true
hdr=$(apt-cache depends linux-headers-amd64 2>/dev/null | awk '/Depends: linux-headers-/{print $2; exit}')
common=$(apt-cache depends "$hdr" 2>/dev/null | awk '/Depends: linux-headers-.*-common/{print $2; exit}')
pkgs="libbpfcc python3-bpfcc libclang-cpp14 libllvm14 libz3-4 libedit2 libbpf1 libelf1 $hdr $common"
echo "bundle: downloading $pkgs"
apt-get download $pkgs >/dev/null
mkdir root
for d in *.deb; do dpkg-deb -x "$d" root; done
rm -rf root/usr/share/doc root/usr/share/man root/usr/share/lintian root/usr/share/bcc
# headers: only x86 is needed
for a in root/usr/src/linux-headers-*-common/arch/*; do
    case "$(basename "$a")" in x86|Kconfig) ;; *) rm -rf "$a" ;; esac
done
rm -rf root/usr/src/linux-headers-*-common/Documentation root/usr/src/linux-headers-*-common/tools 2>/dev/null || true
# nor what only drivers include (BPF programs include none of it), nor the module symbol list:
# the bundle and the working tree travel to a GPU host together under 64 MiB
rm -rf root/usr/src/linux-headers-*-common/include/linux/mfd root/usr/src/linux-headers-*-common/include/sound \
    root/usr/src/linux-headers-*/Module.symvers root/usr/src/linux-headers-*/include/generated/rustc_cfg
mkdir -p root/wheels
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_17_x86_64 --platform any -d root/wheels \
    perfetto msgpack click zstandard prometheus_client >/dev/null   # prometheus_client: watch
ls *.deb > root/BUNDLE-CONTENTS
ls root/wheels >> root/BUNDLE-CONTENTS
tar -C root -cf - . | xz -9e -T2 > "$OUT/clockalign-bcc-bundle.tar.xz"   # -9e: ~1 MB less
size=$(du -m "$OUT/clockalign-bcc-bundle.tar.xz" | cut -f1)
echo "bundle: $OUT/clockalign-bcc-bundle.tar.xz (${size} MiB)"
[ "$size" -lt 64 ] || { echo "bundle: over 64 MiB" >&2; exit 1; }
