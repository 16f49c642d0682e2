#!/usr/bin/env bash
# Dr. GRPO vs GRPO + self-distillation at rl.max_rollouts=64, branched from seeds 0-2's ctx3072 warm starts;
# two learning.py processes at a time (two runs peak near 21.6 GB used on this 23 GiB machine)
cd /work/main
while pgrep -f "learning.py --seeds [34] " >/dev/null; do sleep 20; done
for job in "0 grpo+errcost+ctx3072+r64" "0 grpo+errcost+sd+ctx3072+r64" "1 grpo+errcost+ctx3072+r64" \
           "1 grpo+errcost+sd+ctx3072+r64" "2 grpo+errcost+ctx3072+r64" "2 grpo+errcost+sd+ctx3072+r64"; do
  set -- $job
  while [ "$(pgrep -fc 'benchmarks/learning.py')" -ge 2 ]; do sleep 15; done
  echo "$(date +%T) start seed $1 $2"
  nohup .venv/bin/python benchmarks/learning.py --seeds $1 --arms grpo+errcost+ctx3072 $2 --out runs/learning-ctx \
    > "runs/learning-ctx/log-seed$1-$2.txt" 2>&1 &
  sleep 30
done
wait
echo "$(date +%T) queue done"
