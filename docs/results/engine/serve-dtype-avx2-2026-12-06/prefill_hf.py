import time, torch, random
from transformers import AutoModelForCausalLM
torch.set_num_threads(2)
m = AutoModelForCausalLM.from_pretrained("/root/.cache/carl/models/smollm2-135m-instruct", torch_dtype=torch.float32).eval()
rng = random.Random(0)
with torch.no_grad():
    for L in (256, 1024, 2048):
        ids = torch.tensor([[rng.randrange(100, 40000) for _ in range(L)]])
        ts = []
        for _ in range(3):
            t = time.perf_counter(); m(input_ids=ids, logits_to_keep=1); ts.append(time.perf_counter() - t)
        print(f"hf prefill L={L}: {min(ts):.3f}s -> {2*106e6*L/min(ts)/1e9:.1f} GFLOP/s", flush=True)
