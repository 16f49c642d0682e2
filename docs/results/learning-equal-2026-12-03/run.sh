#!/usr/bin/env bash
# Equal-rollout comparison, seed 1: both arms branch from the level-4 default's seed-1 warm start.
cd /work/main
SRC=runs/learning-default/seed1_grpo+errcost
OUT=runs/learning-equal
for arm in "grpo+errcost:rl.sd_weight=0" "grpo+errcost+sd:rl.sd_weight=0.5"; do
  name=${arm%%:*}; ov=${arm#*:}
  echo "== $name $(date)"
  .venv/bin/carl train --branch-from $SRC:0 run_dir=$OUT/seed1_$name seed=1 micro.seed=1 \
     $ov shaping.tool_error_cost=0.1 rl.steps=30 rl.max_rollouts=64 > $OUT-seed1_$name.log 2>&1
  echo "== $name exit $? $(date)"
done
