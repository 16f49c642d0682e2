"""Every configs/*.toml (but carl midtrain's midtrain*.toml) parses into TrainConfig; each real-model
config builds the trainer's model path (load_model -> set_trainable -> AdamW -> rl_step, and the
HFEngine sampler) on a tiny random model of the same architecture, with model.path overridden to
point at it."""

from pathlib import Path

import pytest
import torch
from tiny_hf import tiny_tokenizer
from train_fakes import token_rollout

from carl.config import load_config
from carl.harness.tools import default_tools
from carl.engine.hf import DTYPES, HFEngine, HFEngineConfig, load_model, pad_token_id
from carl.train.config import TrainConfig
from carl.harness.agent import EpisodeLimits
from carl.train.loop import resolve_model_path, set_trainable
from carl.train.step import rl_step

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
# what the real checkpoints' config.json say (Qwen2.5-Coder-{1.5B,7B}-Instruct); tiny models keep the
# architecture (model_type, GQA, qkv bias, tying) and shrink the sizes
REAL_MODELS = {
    "qwen2.5-coder-1.5b.toml": {"model_type": "qwen2", "num_hidden_layers": 28, "tie_word_embeddings": True},
    "qwen2.5-coder-7b.toml": {"model_type": "qwen2", "num_hidden_layers": 28, "tie_word_embeddings": False},
}


def test_every_config_parses_and_names_known_tools():
    # configs/midtrain*.toml configure `carl midtrain` (MidtrainConfig; tests/test_midtrain_loop.py)
    paths = sorted(p for p in CONFIGS.glob("*.toml") if not p.name.startswith("midtrain"))
    assert {p.name for p in paths} >= {"default.toml", *REAL_MODELS}
    for path in paths:
        cfg = load_config(TrainConfig, path)
        assert set(cfg.tools) <= set(default_tools()), path.name
        assert isinstance(cfg.limits, EpisodeLimits)  # validated by EpisodeLimits itself
        # a rollout budget must leave room for every step (rl.max_rollouts defaults to the demo's 64)
        per_step = cfg.rollout.tasks_per_step * cfg.rollout.group_size
        assert cfg.rl.max_rollouts == 0 or cfg.rl.max_rollouts >= cfg.rl.steps * per_step, path.name


def test_default_toml_is_the_bare_default():
    assert load_config(TrainConfig, CONFIGS / "default.toml") == TrainConfig()


def _tiny_qwen2(folder: Path, tie_word_embeddings: bool) -> Path:
    from transformers import AutoModelForCausalLM, Qwen2Config

    tokenizer = tiny_tokenizer()
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=5,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=tie_word_embeddings, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("name", sorted(REAL_MODELS))
def test_real_model_config_builds_the_trainer_on_a_tiny_model_of_its_architecture(name, tmp_path):
    torch.set_num_threads(1)
    real = REAL_MODELS[name]
    tiny = _tiny_qwen2(tmp_path / "tiny", real["tie_word_embeddings"])
    cfg = load_config(TrainConfig, CONFIGS / name, [f"model.path={tiny}", f"run_dir={tmp_path / 'run'}"])
    assert cfg.tasks and cfg.eval_tasks, "real-model configs train on a tasks.jsonl with held-out eval tasks"
    assert cfg.warm_start.episodes == 0 and cfg.rollout.group_size >= 8
    assert cfg.model.trainable_layers < real["num_hidden_layers"]

    # the calls carl.train.loop.train makes, in its order
    path = resolve_model_path(cfg.model.path)
    tokenizer, model = load_model(path, torch.float32)
    assert model.config.model_type == real["model_type"]
    trainable = set_trainable(model, min(cfg.model.trainable_layers, 2))
    optimizer = torch.optim.AdamW(trainable, lr=cfg.rl.lr, weight_decay=cfg.rl.weight_decay)
    policy = HFEngine(HFEngineConfig(path=str(path), dtype=cfg.model.dtype, temperature=cfg.rollout.temperature,
                                     top_p=cfg.rollout.top_p, seed=cfg.seed, max_batch_size=4))
    try:
        group = []
        for prompt, reward in (([1, 5, 9, 12], 1.0), ([1, 7, 3, 40], 0.0)):
            gen = policy.generate(prompt, 6, stop_ids=[])
            assert len(gen.token_ids) == len(gen.logprobs) == 6
            group.append(token_rollout(prompt + gen.token_ids, [False] * 4 + [True] * 6, reward=reward))
            group[-1].trajectory.segments[0].logprobs_T = [0.0] * 4 + list(gen.logprobs)
        before = {k: v.clone() for k, v in model.state_dict().items()}
        metrics = rl_step(model, optimizer, None, [group], cfg.rl, tokenizer, pad_token_id(tokenizer),
                          token_normalizer=float(cfg.rollout.group_size * cfg.limits.max_new_tokens),
                          temperature=cfg.rollout.temperature, compute_dtype=DTYPES[cfg.model.dtype])
        assert torch.isfinite(torch.tensor(metrics["loss/total"])) and metrics["rl/grad_norm"] > 1e-6, metrics
        changed = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
        if cfg.model.trainable_layers:
            assert changed and all(k.startswith(("model.layers.3.", "model.layers.4.", "model.norm.")) for k in changed)
        else:
            assert "model.embed_tokens.weight" in changed
        assert policy.load_state_dict(model.state_dict(), version=1) == 1
    finally:
        policy.close()
