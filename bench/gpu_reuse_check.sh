#!/usr/bin/env bash
# The GPU-machine measurement of certified reuse (issue 4) with the current object keys, in stages that each
# fit one 10-minute device call. Modeled on bench/gpu_run_check.sh: the machine has no network, so the
# toolchain travels as a `hermetic export` archive split in two parts (.xfer/tc.part.aa, .xfer/tc.part.ab),
# the Python wheels the machine lacks in .whl/ and .whl2/, exllamav3's wheel in .xfer/exl3/; all of it is
# kept in the ignored .device/ folder (and the store in the ignored .hermetic/) while the machine stays warm.
#
#   stage 1  carry .xfer/tc.part.aa .whl             keep the first part and the wheels in .device/
#   stage 2  carry .xfer/tc.part.ab .whl2 .xfer/exl3 join the parts, install the wheels into .device/site,
#                                                    `hermetic import`; the COLD stock build of exl3, timed
#   stage 3  the rename variant, timed; then `--variant rename --explain`
#   stage 4  the facc variant, timed; then `verify --rebuild-sample 8` in the time the call has left
#   stage 5  torch's own JIT build of the stock extension (bench/exl3_torch_jit.py, 16 jobs), timed
# Run `bash bench/gpu_reuse_check.sh N` in the repository root, one device call per stage, each within 30 s of
# the last (the machine goes back after 30 s idle, and .device/ with it: then start again from stage 1).
# Each stage stops itself before STAGE_BUDGET seconds (default 585: a device call lasts 600 s at most); a
# realize stopped by `timeout` resumes at the next stage, reusing what it compiled (noted in its .time file).
# Everything a stage writes lands in one archive, $OUT/stageN.tgz: per step NAME, NAME.jsonl (the --json
# lines: events and the result), NAME.log (stderr), NAME.time (bash `time`, rc, epoch start and end),
# NAME-receipt-*.json (the receipts the step wrote; their schedule.units time every compile), NAME-ninja.log
# (the .ninja_log of the recipe's one build graph), NAME-certs.json (each certificate those receipts name, summarized: decisions, waived
# identifiers, each object's decision and reason, and which objects' inputs mention TORCH_EXTENSION_NAME or
# PYBIND11_COMPILER_TYPE, the identifiers a variant changes, or any PYBIND11_* identifier, or read the file
# the facc patch changes); env.txt (nproc, nvidia-smi -L, Python, a hash of hermetic/*.py in C order).
# The device runs the working tree as it is at each call: compare env.txt's hash between stages.
set -uo pipefail
stage=${1:?stage 1-5}
OUT=${OUT:-/tmp/out}
BUDGET=${STAGE_BUDGET:-585}
T0=$(date +%s)
R=$PWD/.hermetic
W=$PWD/.device/out-stage$stage
mkdir -p .device
rm -rf "$W"; mkdir -p "$OUT" "$W"
trap 'tar czf "$OUT/stage$stage.tgz" -C "$PWD/.device" "out-stage$stage"' EXIT
export PYTHONPATH=$PWD/.device/site:$PWD PIP_NO_INDEX=1 PIP_FIND_LINKS=$PWD/.device/exl3 PYTHONDONTWRITEBYTECODE=1
H=(python3 -m hermetic --root "$R")
left() { echo $((T0 + BUDGET - $(date +%s))); }

{
    date -u +%FT%TZ; echo "stage $stage"; echo "nproc $(nproc)"; nvidia-smi -L
    python3 -V; free -g | head -2; df -h . | tail -1
    echo "hermetic sources: $(LC_ALL=C; cat hermetic/*.py | sha256sum | cut -c1-16)"  # C order: matches a checkout's
} > "$W/env.txt" 2>&1
cat "$W/env.txt"

summarize() {  # NAME RECEIPT...: summarize the certificates the receipts name into NAME-certs.json
    local name=$1; shift
    python3 - "$R" "$W/$name-certs.json" "$@" <<'EOF'
import json, re, sys
from pathlib import Path
import zstandard
from hermetic.store import Store
root, out, receipts = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
store = Store(root / "store")
# the identifiers a variant of recipes/exl3.toml changes, and any pybind11 identifier at all
waivable = re.compile(rb"(?<![A-Za-z0-9_])(TORCH_EXTENSION_NAME|PYBIND11_COMPILER_TYPE)(?![A-Za-z0-9_])")
any_pybind = re.compile(rb"(?<![A-Za-z0-9_])(TORCH_EXTENSION_NAME|PYBIND11_[A-Za-z0-9_]*)(?![A-Za-z0-9_])")
scan: dict = {}
def mentions(path, pattern):
    k = (path, pattern.pattern)
    if k not in scan:
        try:
            scan[k] = pattern.search(Path(path).read_bytes()) is not None
        except OSError:
            scan[k] = None
    return scan[k]
result = {}
for rp in receipts:
    receipt = json.loads(Path(rp).read_text())
    for m in receipt.get("modules", []):
        raw = zstandard.ZstdDecompressor().decompress(store.blob_path(m["certificate_blob"]).read_bytes(),
                                                      max_output_size=1 << 31)
        cert = json.loads(raw)
        decisions, objects, waived = {}, [], set()
        blocked_exact = blocked_any = patched = 0
        for o in cert["objects"]:
            decisions[o["decision"]] = decisions.get(o["decision"], 0) + 1
            waived.update(o.get("waived") or [])
            paths = [i[0] for i in o.get("inputs", [])]
            exact = any(mentions(p, waivable) for p in paths)
            anyp = any(mentions(p, any_pybind) for p in paths)
            act = any(p.endswith("/activation_kernels.cuh") for p in paths)
            blocked_exact += exact; blocked_any += anyp; patched += act
            fb = o.get("first_built_by") or {}
            objects.append({"source": o["source"], "decision": o["decision"], "reason": o.get("reason") or "",
                            "waived": o.get("waived") or [], "first_built_by": fb.get("variant"),
                            "inputs": len(paths), "mentions_waivable": exact, "mentions_any_pybind11": anyp,
                            "reads_activation_kernels": act})
        result[f"{Path(rp).name}:{m['module']}"] = {
            "module": m["module"], "variant": cert.get("variant"), "certificate_blob": m["certificate_blob"],
            "certificate_sha256": m["certificate_sha256"], "receipt_counts": m.get("counts"),
            "objects": len(cert["objects"]), "decisions": decisions, "waived": sorted(waived),
            "module_build": cert.get("module_build", {}).get("decision"),
            "inputs_total": sum(o["inputs"] for o in objects),
            "objects_mentioning_TORCH_EXTENSION_NAME_or_PYBIND11_COMPILER_TYPE": blocked_exact,
            "objects_mentioning_any_PYBIND11_identifier_or_TORCH_EXTENSION_NAME": blocked_any,
            "objects_reading_activation_kernels.cuh": patched,
            "per_object": objects}
out.write_text(json.dumps(result, indent=1) + "\n")
for k, v in result.items():
    print(k, v["objects"], v["decisions"], "waived", v["waived"],
          "mention exact/any:", v["objects_mentioning_TORCH_EXTENSION_NAME_or_PYBIND11_COMPILER_TYPE"],
          v["objects_mentioning_any_PYBIND11_identifier_or_TORCH_EXTENSION_NAME"],
          "read activation_kernels.cuh:", v["objects_reading_activation_kernels.cuh"])
EOF
}

realize() {  # NAME VARIANT [ARGS...]: one realize of exl3, timed, stopped before the stage's budget
    local name=$1 variant=$2; shift 2
    local limit=$(( $(left) - 25 ))
    if [ "$limit" -lt 30 ]; then echo "$name: skipped, $(left) s left in this stage" | tee "$W/$name.time"; return 1; fi
    touch "$W/.mark"; sleep 1
    local s e rc
    s=$(date +%s.%N)
    { time timeout -k 15 "$limit" "${H[@]}" realize recipes/exl3.toml --variant "$variant" --json "$@" \
        > "$W/$name.jsonl" 2> "$W/$name.log"; } 2> "$W/$name.time"
    rc=$?
    e=$(date +%s.%N)
    echo "rc $rc (124: stopped by timeout after $limit s) start $s end $e" >> "$W/$name.time"
    echo "== $name: rc $rc"; cat "$W/$name.time"; tail -1 "$W/$name.jsonl"; tail -3 "$W/$name.log"
    local rs=()
    for f in $(find "$R/receipts" -name '*.json' -newer "$W/.mark" 2>/dev/null); do
        cp "$f" "$W/$name-receipt-$(basename "$f")"; rs+=("$f")
    done
    # one build graph for every variant (extensions/graph.py): its ninja log is the recipe's, and each compile's
    # phase, start, wall time and peak memory are in the receipt's schedule.units
    local nl="$R/build/exl3/.ninja_log"
    [ -f "$nl" ] && cp "$nl" "$W/$name-ninja.log"
    [ ${#rs[@]} -gt 0 ] && summarize "$name" "${rs[@]}"
    [ "$rc" -eq 0 ] && touch ".device/done-$variant"
    return "$rc"
}

case $stage in
1)
    mv .xfer/tc.part.aa .device/ && cp .whl/*.whl .device/
    ls -la .device
    ;;
2)
    cat .device/tc.part.aa .xfer/tc.part.ab > .device/tc.tar.zst && rm -f .device/tc.part.aa
    cp .whl2/*.whl .device/ 2>/dev/null; mkdir -p .device/exl3 && cp .xfer/exl3/*.whl .device/exl3/
    python3 -m pip install -q --no-index --no-deps --no-compile --target .device/site .device/*.whl 2>&1 | tail -2
    "${H[@]}" import .device/tc.tar.zst --trust-unsigned > "$W/import.log" 2>&1; echo "import exit $?"; tail -1 "$W/import.log"
    realize stock-cold stock
    ;;
3)
    [ -f .device/done-stock ] || realize stock-resumed stock
    realize rename rename
    "${H[@]}" realize recipes/exl3.toml --variant rename --explain > "$W/rename-explain.log" 2>&1
    echo "rename --explain exit $?"; grep -c ': reused' "$W/rename-explain.log"
    ;;
4)
    [ -f .device/done-rename ] || realize rename-resumed rename
    realize facc facc
    limit=$(( $(left) - 15 ))
    if [ "$limit" -ge 60 ]; then
        s=$(date +%s.%N)
        { time timeout -k 10 "$limit" "${H[@]}" verify --rebuild-sample 8 --json > "$W/verify.jsonl" 2> "$W/verify.log"; } \
            2> "$W/verify.time"
        echo "rc $? (124: stopped by timeout after $limit s) start $s end $(date +%s.%N)" >> "$W/verify.time"
        cat "$W/verify.time"; tail -12 "$W/verify.log"; tail -1 "$W/verify.jsonl"
    else
        echo "verify: skipped, $(left) s left in this stage" | tee "$W/verify.time"
    fi
    ;;
5)
    rm -rf .device/jit; mkdir -p .device/jit
    limit=$(( $(left) - 15 ))
    { time timeout -k 10 "$limit" python3 bench/exl3_torch_jit.py .device/exl3/exllamav3-1.6.5-py3-none-any.whl \
        .device/jit/build 16 > "$W/jit.jsonl" 2> "$W/jit.log"; } 2> "$W/jit.time"
    echo "rc $? (124: stopped by timeout after $limit s)" >> "$W/jit.time"
    cat "$W/jit.time" "$W/jit.jsonl"; tail -5 "$W/jit.log"
    [ -f .device/jit/build/.ninja_log ] && cp .device/jit/build/.ninja_log "$W/jit-ninja.log"
    ;;
esac
echo "stage $stage done, $(left) s of its budget left"
