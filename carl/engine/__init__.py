"""Inference engines: what serves the policy to rollouts, evaluation and production.

    base.py            the Engine protocol, SamplingParams, engine errors, caller-side stats
    config.py          EngineConfig (`engine.*` of a run)
    hf.py              HFEngine: the in-process transformers sampler (exact reference; batching.py,
                       prefix_cache.py), and model loading
    vllm.py            VLLMEngine: a vLLM server over HTTP, token-exact, weights by delta
    vllm_server.py     the managed vLLM server process; vllm_env.py its own venv
    vllm_worker.py     carl's worker extension inside vLLM (runs in vLLM's venv)
    weights.py         the trainer's weight store: versions as lossless deltas, checked engine-side
    streams.py         per-episode seeds (common random numbers)
    openai_client.py   OpenAIChatPolicy: chat-level client for any OpenAI-compatible endpoint
    smollm2.py         the embedded default model
"""
