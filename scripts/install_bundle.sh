#!/usr/bin/env bash
# Install clockalign from the offline bundle on a host with no package registry.
#   sudo scripts/install_bundle.sh [BUNDLE.tar.xz] [PREFIX]
# Unpacks BCC to PREFIX (default /opt/clockalign-bcc), links the bundled headers at
# /lib/modules/$(uname -r)/build when the kernel has none, mounts tracefs, installs the
# bundled wheels that the host's python3 lacks, builds the C helpers (gcc), and writes
# /usr/local/bin/clockalign that runs this checkout with the host's python3.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
B=${1:-.bundle/clockalign-bcc-bundle.tar.xz}
P=${2:-/opt/clockalign-bcc}
say() { echo "install_bundle: $*"; }
[ "$(id -u)" -eq 0 ] || { echo "install_bundle: run as root" >&2; exit 1; }
[ -f "$B" ] || { echo "install_bundle: no bundle at $B (make it with scripts/make_bundle.sh)" >&2; exit 1; }
mkdir -p "$P"
if [ ! -f "$P/BUNDLE-CONTENTS" ] || [ "$B" -nt "$P/BUNDLE-CONTENTS" ]; then
    tar -C "$P" -xJf "$B"
    say "unpacked BCC to $P"
fi
KREL=$(uname -r)
if [ ! -e "/lib/modules/$KREL/build/Makefile" ]; then
    build=$(ls -d "$P"/usr/src/linux-headers-*-amd64 | sort -V | tail -1)
    common=$(ls -d "$P"/usr/src/linux-headers-*-common | sort -V | tail -1)
    mkdir -p "/lib/modules/$KREL"
    ln -sfn "$build" "/lib/modules/$KREL/build"
    ln -sfn "$common" "/lib/modules/$KREL/source"
    say "no headers match kernel $KREL: linked bundled $(basename "$build")"
fi
[ -d /sys/kernel/tracing/events ] || mount -t tracefs nodev /sys/kernel/tracing
SITE="$P/site"
mkdir -p "$SITE"
for w in "$P"/wheels/*.whl; do
    name=$(basename "$w" | cut -d- -f1)
    python3 -c "import importlib.util,sys; sys.exit(0 if importlib.util.find_spec('${name,,}') else 1)" 2>/dev/null \
        || python3 -m pip install -q --no-index --no-deps --target "$SITE" "$w"
done
LIBDIR="$P/usr/lib/x86_64-linux-gnu"
PYBCC="$P/usr/lib/python3/dist-packages"
cat > /usr/local/bin/clockalign <<WRAP
#!/bin/sh
export LD_LIBRARY_PATH="$LIBDIR\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export PYTHONPATH="$ROOT/agent:$PYBCC:$SITE\${PYTHONPATH:+:\$PYTHONPATH}"
exec python3 -m clockalign.cli.main "\$@"
WRAP
chmod +x /usr/local/bin/clockalign
# the C helpers, built with this host's compiler (against its CUPTI, where one is found)
command -v gcc >/dev/null || command -v cc >/dev/null \
    || { echo "install_bundle: no C compiler: install gcc, then run this again" >&2; exit 1; }
LD_LIBRARY_PATH="$LIBDIR" PYTHONPATH="$ROOT/agent:$PYBCC:$SITE" python3 -m clockalign.native.build
cat > "$P/env.sh" <<ENV
export LD_LIBRARY_PATH="$LIBDIR\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export PYTHONPATH="$ROOT/agent:$PYBCC:$SITE\${PYTHONPATH:+:\$PYTHONPATH}"
ENV
say "ready: /usr/local/bin/clockalign (env for python/pytest: . $P/env.sh)"
