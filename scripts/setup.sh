#!/usr/bin/env bash
# Set up clockalign on a Debian/Ubuntu host; safe to run again (each step checks first).
#   scripts/setup.sh      # OS packages, kernel headers, tracefs, .venv, the C helpers,
#                         # /usr/local/bin/clockalign
# Not root: it re-runs itself with sudo.  Root without sudo (a bare container): it installs
# sudo too, so that `sudo clockalign ...` works as typed afterwards.
# BCC comes from the OS package python3-bpfcc (the PyPI package "bcc" is unrelated).
# Where no headers match the running kernel, the newest distro headers are linked at
# /lib/modules/$(uname -r)/build (and -common at .../source), and this script says so.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
say() { echo "setup: $*"; }

if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "setup: run as root: it installs OS packages" >&2; exit 1; }
    exec sudo "$0" "$@"
fi
export DEBIAN_FRONTEND=noninteractive
KREL=$(uname -r)

need=()
for pkg in python3-bpfcc python3-venv python3-pip gcc libc6-dev sudo; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || need+=("$pkg")
done
have_headers() { [ -e "/lib/modules/$KREL/build/include/linux/kconfig.h" ] || [ -e "/lib/modules/$KREL/build/Makefile" ]; }
if ! have_headers; then
    if apt-cache show "linux-headers-$KREL" >/dev/null 2>&1 || { apt-get update -qq && apt-cache show "linux-headers-$KREL" >/dev/null 2>&1; }; then
        need+=("linux-headers-$KREL")
    else
        dpkg-query -W -f='${Status}' linux-headers-amd64 2>/dev/null | grep -q "ok installed" || need+=(linux-headers-amd64)
    fi
fi
if [ ${#need[@]} -gt 0 ]; then
    say "installing ${need[*]}"
    apt-get update -qq
    apt-get install -y -qq "${need[@]}" >/dev/null
fi

# --- watch (issue 11): promtool, Prometheus and Alertmanager for the rules' tests
for pkg in prometheus prometheus-alertmanager; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed"; then
        say "installing $pkg (clockalign watch's rule and alert tests)"
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "$pkg" >/dev/null
    fi
done
# --- end watch

if ! have_headers; then
    build=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -1 || true)
    common=$(ls -d /usr/src/linux-headers-*-common 2>/dev/null | sort -V | tail -1 || true)
    if [ -z "$build" ]; then
        echo "setup: no kernel headers for $KREL and no distro headers to fall back on" >&2
        exit 1
    fi
    mkdir -p "/lib/modules/$KREL"
    ln -sfn "$build" "/lib/modules/$KREL/build"
    [ -n "$common" ] && ln -sfn "$common" "/lib/modules/$KREL/source"
    say "no headers match kernel $KREL: linked the newest distro headers $build (and $common);"
    say "  enough for tracepoints and uprobes, which read no kernel structs"
fi

if [ ! -d /sys/kernel/tracing/events ]; then
    mount -t tracefs nodev /sys/kernel/tracing && say "mounted tracefs at /sys/kernel/tracing"
fi

PY=/usr/bin/python3
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c "import bcc" 2>/dev/null; then
    rm -rf .venv
    "$PY" -m venv --system-site-packages .venv
    say "created .venv (sees the OS's BCC)"
fi
extras="test"
if [ -e /dev/nvidiactl ] || [ -e /dev/nvidia0 ]; then extras="test,gpu"; fi
extras="$extras,inject"    # inject (issue 15): uvicorn, starlette, onnxruntime, locust
stamp=".venv/.clockalign-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[$extras]"
    touch "$stamp"
fi
# --- inject (issue 15): MLServer, the V2 server the V2 driver is tested against, in its
# own venv so its pins do not fight the project's (protobuf is the Perfetto export's)
if [ ! -x .venv-mlserver/bin/mlserver ] || ! .venv-mlserver/bin/python -c "import mlserver" 2>/dev/null; then
    rm -rf .venv-mlserver
    "$PY" -m venv .venv-mlserver
    .venv-mlserver/bin/python -m pip install -q --disable-pip-version-check "mlserver==1.7.1"
    say "created .venv-mlserver (MLServer $(.venv-mlserver/bin/python -c 'import mlserver; print(mlserver.__version__)'))"
fi
# --- end inject
# --- gpu-activity (issue 14): CUPTI + cuda.h headers to build the injection library against
# (and the stand-in libcupti of the tests); the wheels also carry a libcupti.  Pinned to
# CUDA 13.0, the H200 driver's CUDA version; a host with a CUDA toolkit finds its own CUPTI.
cupti_stamp=".venv/.clockalign-cupti-13.0"
if [ ! -f "$cupti_stamp" ]; then
    if .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps \
            "nvidia-cuda-cupti==13.0.85" "nvidia-cuda-runtime==13.0.96" "nvidia-cuda-crt==13.0.88"; then
        touch "$cupti_stamp"
    else
        say "could not install the CUPTI headers (nvidia-cuda-cupti): --gpu-activity will look for a CUDA toolkit"
    fi
fi
# --- end gpu-activity
# the C helpers (agent/clockalign/native/: the event reader, the ping-pong loop, the CUPTI
# injection library for the CUPTI above); commands never compile them
.venv/bin/python -m clockalign.native.build
ln -sfn "$ROOT/.venv/bin/clockalign" /usr/local/bin/clockalign
say "ready: $(.venv/bin/clockalign --version) at /usr/local/bin/clockalign (sudo clockalign ... works)"
