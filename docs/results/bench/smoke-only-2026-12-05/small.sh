#!/bin/bash
cd /work/main
C=.venv/bin/carl
/usr/bin/time -f "WALL %e s whole (first: fills the env cache)" $C bench build /tmp/sm/small.toml --out /tmp/sm/whole0
/usr/bin/time -f "WALL %e s smoke-only" $C bench build /tmp/sm/small.toml --out /tmp/sm/smoke --smoke-only
/usr/bin/time -f "WALL %e s whole" $C bench build /tmp/sm/small.toml --out /tmp/sm/whole
echo DONE
