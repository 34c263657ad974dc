#!/usr/bin/env bash
# The GPU-machine check of `hermetic run` (issue 5), in stages that each fit one 10-minute device call.
# The machine has no network: the toolchain travels as a `hermetic export` archive split in two parts
# (.xfer/tc.part.aa, .xfer/tc.part.ab) and the few Python wheels the machine lacks travel in .whl/ and .whl2/.
#
#   stage 1  carry .xfer/tc.part.aa .whl    keep the first part and the wheels in .device/
#   stage 2  carry .xfer/tc.part.ab .whl2 .xfer/exl3 (exllamav3's wheel, its sources)
#                                           import the toolchain; realize p2p; a smoke run with torch's kernels
#                                           (CUDA graphs, NVML, events, P2P across two GPUs); build exl3's stock
#                                           variant (stopped at 330 s if need be; the next realize resumes)
#   stage 3  realize exl3 (stock + facc); the full run with --record-digests; each guard trips once
#   stage 4  the full run again with the repetitions stage 3's pilot recommends (REPS=N)
# Everything a stage writes lands in one archive, $OUT/stageN.tgz (the device tool brings back 8 files at most).
set -uo pipefail
stage=${1:?stage 1-4}
OUT=${OUT:-/tmp/out}
W=$PWD/.device/out-stage$stage
rm -rf "$W"; mkdir -p "$OUT" "$W"
trap 'tar czf "$OUT/stage$stage.tgz" -C "$PWD/.device" "out-stage$stage"' EXIT
export PYTHONPATH=$PWD/.device/site:$PWD PIP_NO_INDEX=1 PIP_FIND_LINKS=$PWD/.device/exl3 PYTHONDONTWRITEBYTECODE=1
H=(python3 -m hermetic --root "$PWD/.hermetic")
PEER=()
[ "$(nvidia-smi -L | wc -l)" -ge 2 ] && PEER=(--peer 1)

last_run() { ls -td .hermetic/runs/*/ | head -1; }
keep() {  # copy one run's outputs to $OUT under a prefix
    local d; d=$(last_run)
    for f in report.md results.json receipt.json plot.png worker.log; do [ -f "$d/$f" ] && cp "$d/$f" "$W/$1-$f"; done
}

case $stage in
1)
    mv .xfer/tc.part.aa .device/ && cp .whl/*.whl .device/
    python3 -V; nvidia-smi -L; nvidia-smi --query-gpu=power.limit,driver_version --format=csv
    python3 -c "import numpy, psutil, requests, rich, ninja, pynvml, packaging; print('deps ok')" 2>&1 | tail -1
    ;;
2)
    cat .device/tc.part.aa .xfer/tc.part.ab > .device/tc.tar.zst
    cp .whl2/*.whl .device/ 2>/dev/null; mkdir -p .device/exl3 && cp .xfer/exl3/*.whl .device/exl3/
    python3 -m pip install -q --no-index --no-deps --no-compile --target .device/site .device/*.whl 2>&1 | tail -2
    "${H[@]}" import .device/tc.tar.zst 2>&1 | tail -1
    "${H[@]}" realize recipes/p2p.toml 2>&1 | tail -1
    sed -e 's/^kernels = \["stock", "facc"\]/kernels = ["torch"]/' \
        -e 's|^realize = \["../recipes/p2p.toml", "../recipes/exl3.toml"\]|realize = ["../recipes/p2p.toml"]|' \
        runner/worker.toml > runner/smoke-gpu.toml
    "${H[@]}" run runner/smoke-gpu.toml --power-cap 700 --repetitions 2 "${PEER[@]}" > "$W/smoke.log" 2>&1
    echo "smoke run exit $?"; tail -25 "$W/smoke.log"; keep smoke
    timeout 330 "${H[@]}" realize recipes/exl3.toml --variant stock > "$W/exl3-stock.log" 2>&1
    echo "exl3 stock exit $?"; tail -3 "$W/exl3-stock.log"
    ;;
3)
    timeout 400 "${H[@]}" realize recipes/exl3.toml > "$W/exl3.log" 2>&1; echo "exl3 exit $?"; tail -2 "$W/exl3.log"
    "${H[@]}" run runner/worker.toml --power-cap 700 --record-digests "${PEER[@]}" > "$W/run1.log" 2>&1
    echo "run exit $?"; tail -30 "$W/run1.log"; keep run1
    cp manifests/digests/sm*.txt "$W/" 2>/dev/null
    # each guard trips once: a lock held by another process, a power cap that does not hold, a memory limit
    uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0)
    python3 -c "import fcntl,sys,time; f=open(sys.argv[1],'w'); fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)" \
        "/run/lock/hermetic/gpu-$uuid.lock" & holder=$!
    sleep 1
    "${H[@]}" run runner/worker.toml --power-cap 700 --lock-timeout 3 > "$W/trip-lock.log" 2>&1
    echo "lock held elsewhere: exit $?"; tail -3 "$W/trip-lock.log"; kill $holder
    "${H[@]}" run runner/worker.toml > "$W/trip-power.log" 2>&1
    echo "power cap 225 W expected: exit $?"; tail -3 "$W/trip-power.log"
    sed 's/^memory = "32G"/memory = "1G"/' runner/worker.toml > runner/trip-memory.toml
    "${H[@]}" run runner/trip-memory.toml --power-cap 700 > "$W/trip-memory.log" 2>&1
    echo "memory 1G: exit $?"; tail -3 "$W/trip-memory.log"; keep trip-memory
    python3 -c "from hermetic.run.gpu import nvml_facts; import json; print(json.dumps(nvml_facts(0).to_json(), indent=1))" \
        > "$W/h200-facts.json"
    ;;
4)
    "${H[@]}" run runner/worker.toml --power-cap 700 --repetitions "${REPS:-10}" "${PEER[@]}" > "$W/run2.log" 2>&1
    echo "run exit $?"; tail -30 "$W/run2.log"; keep run2
    ;;
esac
