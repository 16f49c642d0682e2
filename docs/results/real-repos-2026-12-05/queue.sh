#!/bin/bash
# real-repo bench: the default suite's smoke subset (24 tasks, 12 dev packages), the two-rule demo's warm start and RL checkpoints
set -x
cd /work/main
C=.venv/bin/carl
/usr/bin/time -f "WALL %e s build" $C bench build /tmp/rr/small/small.toml --out /tmp/rr/suite2 || exit 1
B() { name=$1; ck=$2; rc=$3; /usr/bin/time -f "WALL %e s $name" $C bench run --suite /tmp/rr/suite2 --smoke --checkpoint $ck --run-config $rc --samples 2 --seed 0 --name $name --out /tmp/rr/bench/$name.json; }
mkdir -p /tmp/rr/bench
B c954498-warm /tmp/fc/runs/default/checkpoints/step_000000 /tmp/fc/runs/default/config.toml
B c954498-rl /tmp/fc/runs/default/checkpoints/step_000005 /tmp/fc/runs/default/config.toml
B 1d4254d-rl /tmp/fc2/runs/default/checkpoints/step_000005 /tmp/fc2/runs/default/config.toml
echo QUEUE-DONE
