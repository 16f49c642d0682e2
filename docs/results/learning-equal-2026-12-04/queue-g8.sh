#!/usr/bin/env bash
# G = 8 x 1 task at rl.max_rollouts=64, branched from seeds 0-2's ctx3072 warm starts, after queue-sd.sh's jobs
cd /work/main
while [ "$(grep -c ' start ' runs/learning-ctx/queue-sd.log)" -lt 6 ]; do sleep 20; done
for s in 0 1 2; do
  while [ "$(pgrep -fc 'benchmarks/learning.py')" -ge 2 ]; do sleep 15; done
  echo "$(date +%T) start seed $s g8"
  nohup .venv/bin/python benchmarks/learning.py --seeds $s --arms grpo+errcost+ctx3072 grpo+errcost+ctx3072+r64+g8 \
    --out runs/learning-ctx > "runs/learning-ctx/log-seed$s-grpo+errcost+ctx3072+r64+g8.txt" 2>&1 &
  sleep 30
done
wait
echo "$(date +%T) queue done"
