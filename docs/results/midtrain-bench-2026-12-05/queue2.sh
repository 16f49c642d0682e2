#!/bin/bash
# bench smoke runs after queue.sh's trainings: raw SmolLM2 vs mid-trained; demo warm start and RL from each
set -x
cd /work/main
until grep -q QUEUE-TRAIN-DONE /tmp/mt/queue.log; do sleep 30; done
C=.venv/bin/carl
last() { ls -d $1/checkpoints/step_* | sort | tail -1; }
B() { name=$1; ck=$2; rc=$3; /usr/bin/time -f "WALL %e s $name" $C bench run --suite /tmp/mt/suite --smoke --checkpoint $ck --run-config $rc --samples 2 --seed 0 --name $name --out /tmp/mt/bench/$name.json; }
mkdir -p /tmp/mt/bench
B smollm2 ~/.cache/carl/models/smollm2-135m-instruct /tmp/mt/base/config.toml
B midtrain /tmp/mt/midtrain/checkpoints/step_000200/model /tmp/mt/base/config.toml
B base-warm /tmp/mt/base/checkpoints/step_000000 /tmp/mt/base/config.toml
B base-rl $(last /tmp/mt/base) /tmp/mt/base/config.toml
B mid-warm /tmp/mt/mid/checkpoints/step_000000 /tmp/mt/mid/config.toml
B mid-rl $(last /tmp/mt/mid) /tmp/mt/mid/config.toml
echo QUEUE-BENCH-DONE
