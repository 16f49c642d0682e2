#!/bin/bash
# SIGTERM during RL rollouts: time to exit, servers started, processes left
# usage: sig.sh SRC_DIR RUN_DIR
SRC=$1; RUN=$2; rm -rf $RUN
cd $SRC
/work/main/.venv/bin/python -m carl train --branch-from /tmp/fc/runs/default run_dir=$RUN > $RUN.log 2>&1 &
PID=$!
until grep -q "RL step 1/5: [1-9]" $RUN.log 2>/dev/null; do sleep 1; kill -0 $PID 2>/dev/null || { echo "exited early"; tail $RUN.log; exit 1; }; done
sleep 5
T0=$(date +%s.%N); kill -TERM $PID; wait $PID; RC=$?; T1=$(date +%s.%N)
echo "rc $RC; SIGTERM to exit $(echo "$T1 - $T0" | bc) s"
echo "servers started: $(grep -c 'carl: starting vLLM' $RUN/engine/vllm.log 2>/dev/null)"
sleep 2; echo "vllm processes left: $(pgrep -f "vllm.entrypoints.*$RUN" | wc -l)"
tail -3 $RUN.log
