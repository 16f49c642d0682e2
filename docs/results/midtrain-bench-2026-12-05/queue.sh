#!/bin/bash
# issue 32: midtrain -> bench before/after (midtrain alone, midtrain then the default RL)
set -x
cd /work/main
C=.venv/bin/carl
T() { /usr/bin/time -f "WALL %e s  $*" "$@"; }
T $C bench build /tmp/mt/small.toml --out /tmp/mt/suite || exit 1
T $C midtrain configs/midtrain.toml eval_every=100 run_dir=/tmp/mt/midtrain || exit 1
T $C train run_dir=/tmp/mt/base || exit 1
T $C train run_dir=/tmp/mt/mid model.path=/tmp/mt/midtrain/checkpoints/step_000200/model || exit 1
echo QUEUE-TRAIN-DONE
