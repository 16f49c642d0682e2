#!/bin/bash
# The suite on 3 pytest-xdist workers (one test file per worker at a time), then in one process, same checkout, nothing else running.
cd /work/main
git rev-parse HEAD > /tmp/suite/revision.txt
nproc > /tmp/suite/nproc.txt; grep -m1 "model name" /proc/cpuinfo >> /tmp/suite/nproc.txt
export CARL_REQUIRE_VLLM=1
s=$(date +%s); /usr/bin/time -v .venv/bin/python -m pytest -q -n 3 --dist loadfile --durations=0 > /tmp/suite/n3.log 2> /tmp/suite/n3.time; echo "rc=$? wall_s=$(( $(date +%s) - s ))" > /tmp/suite/n3.result
s=$(date +%s); /usr/bin/time -v .venv/bin/python -m pytest -q --durations=0 > /tmp/suite/serial.log 2> /tmp/suite/serial.time; echo "rc=$? wall_s=$(( $(date +%s) - s ))" > /tmp/suite/serial.result
