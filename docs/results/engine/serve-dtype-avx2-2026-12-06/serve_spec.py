import sys, time
from carl.engine.vllm_server import ServerSpec, VLLMServer
spec = ServerSpec(model="/root/.cache/carl/models/smollm2-135m-instruct", dtype=sys.argv[1], port=int(sys.argv[2]), max_model_len=4096,
                  block_size=32, enforce_eager=True)
s = VLLMServer(spec, f"/tmp/prefill/vllm_{sys.argv[1]}.log", max_restarts=0); s.start(); print("up", s.url, flush=True)
while s.alive(): time.sleep(1)
