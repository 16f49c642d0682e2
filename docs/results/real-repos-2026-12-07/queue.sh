#!/bin/bash
# real-repo bench: the 64-episode default's fresh seeds 10 and 12, warm start and RL checkpoints, on the small-cpu suite's smoke subset
set -x
cd /work/main
C=.venv/bin/carl
R=runs/learning-fresh
/usr/bin/time -f "WALL %e s build" $C bench build /tmp/rr2/small/small.toml --out /tmp/rr2/suite || exit 1
B() { name=$1; ck=$2; rc=$3; /usr/bin/time -f "WALL %e s $name" $C bench run --suite /tmp/rr2/suite --smoke --checkpoint $ck --run-config $rc --samples 2 --seed 0 --name $name --out /tmp/rr2/bench/$name.json; }
mkdir -p /tmp/rr2/bench
for s in 10 12; do
  d="$R/seed${s}_grpo+errcost"
  B seed$s-warm $d/checkpoints/step_000000 $d/config.toml
  B seed$s-rl $d/checkpoints/step_000005 $d/config.toml
done
echo QUEUE-DONE
