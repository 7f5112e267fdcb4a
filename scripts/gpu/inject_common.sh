# Sourced by the `clockalign inject` GPU scripts (scripts/gpu/lifecycle.sh, standby.sh) from the
# repository root, with out (the output folder), PY, NAME (the script's name for messages)
# and t_start set: BCC from the offline bundle at .bundle/ (scripts/make_bundle.sh), else an
# installed one (/opt/clockalign-bcc/env.sh) or the OS's; uvicorn and starlette from .whl/
# where $PY lacks them (scripts/gpu/lifecycle.wheels); CA=($PY -m clockalign.cli.main);
# $out/host.txt; and run NAME SECONDS ARGS...: one `clockalign inject ARGS ${common[@]}`
# within what is left of BUDGET_S, interrupted like Ctrl-C at its limit.
ROOT=$(pwd)
export PYTHONUNBUFFERED=1
log() { echo "== $* ($(date -u +%T))"; }
if [ -f .bundle/clockalign-bcc-bundle.tar.xz ]; then
    scripts/install_bundle.sh > "$out/install.txt" 2>&1 || { cat "$out/install.txt"; exit 1; }
    . /opt/clockalign-bcc/env.sh
    SITE=/opt/clockalign-bcc/site
elif [ -f /opt/clockalign-bcc/env.sh ]; then
    echo "BCC installed already (/opt/clockalign-bcc/env.sh)" > "$out/install.txt"
    . /opt/clockalign-bcc/env.sh
    SITE=/opt/clockalign-bcc/site
elif "$PY" -c "import bcc" 2>/dev/null; then
    echo "BCC from the OS (no offline bundle here)" > "$out/install.txt"
    export PYTHONPATH="$ROOT/agent${PYTHONPATH:+:$PYTHONPATH}"
    SITE=$ROOT/.whl/site
else
    echo "$NAME: no BCC: no .bundle/clockalign-bcc-bundle.tar.xz and $PY cannot import bcc" >&2
    exit 1
fi
for mod in uvicorn starlette; do
    "$PY" -c "import $mod" 2>/dev/null && continue
    w=$(ls .whl/$mod-*.whl 2>/dev/null | head -1)
    [ -n "$w" ] || { echo "$NAME: $PY has no $mod and .whl/ has no wheel of it (scripts/gpu/lifecycle.wheels)" >&2; exit 1; }
    mkdir -p "$SITE"
    "$PY" -m pip install -q --no-index --no-deps --target "$SITE" "$w" >> "$out/install.txt" 2>&1
    case ":${PYTHONPATH:-}:" in *":$SITE:"*) ;; *) export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$SITE" ;; esac
done
CA=("$PY" -m clockalign.cli.main)
{ uname -a; date -u; nproc; { command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version --format=csv || echo "no nvidia-smi"; } 2>&1 | head -3
  "$PY" -c 'import sys; print(sys.version)'
  "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())' 2>&1 | tail -1
  "$PY" -c 'import onnxruntime as o; print("onnxruntime", o.__version__, o.get_available_providers())' 2>&1 | tail -1
  "$PY" -c 'import uvicorn, starlette; print("uvicorn", uvicorn.__version__, "starlette", starlette.__version__)' 2>&1 | tail -1
  "$PY" -c 'import locust; print("locust", locust.__version__)' 2>&1 | tail -1
} > "$out/host.txt" 2>&1
cat "$out/host.txt"
skipped=()
rm -f "$out/commands.txt"
left() { echo $(( BUDGET_S * ${LIMIT_SCALE:-1} - ($(date +%s) - t_start) )); }
run() {   # run NAME SECONDS ARGS...: one `clockalign inject`, bounded, interrupted like Ctrl-C
    local name=$1 secs=$(( $2 * ${LIMIT_SCALE:-1} )) l; shift 2
    l=$(left); [ "$l" -lt "$secs" ] && secs=$l
    if [ "$secs" -lt 20 ]; then skipped+=("$name: not run, the time budget ($BUDGET_S s) was spent"); return; fi
    log "$name (at most $secs s)"
    echo "clockalign inject $* ${common[*]}" >> "$out/commands.txt"
    timeout -s INT "$secs" "${CA[@]}" inject "$@" "${common[@]}" > "$out/inject-$name.txt" 2>&1
    local rc=$?
    [ "$rc" -eq 124 ] || [ "$rc" -eq 130 ] && skipped+=("$name: stopped at its limit of $secs s (inject-$name.txt): the rows it had not finished are missing")
    echo "$name rc=$rc"; grep -vE "^inject: " "$out/inject-$name.txt" | tail -6
}
torch_gpu() { "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; }
ort_gpu() { "$PY" -c "import onnxruntime as o, sys; sys.exit(0 if 'CUDAExecutionProvider' in o.get_available_providers() else 1)" 2>/dev/null; }
