"""Tiny random Hugging Face models and a tiny byte-level BPE tokenizer, built in code for tests.

Nothing is downloaded: the tokenizer is trained on a few sentences, the model is a random init
from a config, and both are saved with `save_pretrained` so tests load them through the real
loading path.
"""

from __future__ import annotations

from pathlib import Path

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "You are a coding agent. Fix the failing tests in the repository.",
    '<tool name="read_file"><path>src/x.py</path></tool>',
    '<tool name="edit_file"><path>a.py</path><old>x = 1</old><new>x = 2</new></tool>',
    '<tool name="run_tests"></tool> 2 failed, 3 passed. FAILED tests/test_a.py::test_add',
    "error: unknown tool 'reed_file'. Valid tools: read_file, write_file, edit_file, run_tests, finish",
    "def add(a, b):\n    return a + b\n",
] * 4


def tiny_tokenizer():
    """A ChatML byte-level BPE tokenizer with about 300 tokens; eos = <|im_end|>, pad = <pad>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<pad>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=320, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<|im_end|>", bos_token=None, unk_token=None
    )
    fast.chat_template = CHATML
    return fast


def save_tiny_model(folder: str | Path, arch: str = "llama", seed: int = 0, head_dim: int = 16) -> Path:
    """Save a random tiny causal LM ("llama" dense or "qwen2_moe") and the tiny tokenizer to `folder`.
    `head_dim` 16 (4 heads of a 64-wide model) or 64 (2 heads of a 128-wide one: vLLM's CPU
    attention kernels take head sizes of 32 and up)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2MoeConfig

    tokenizer = tiny_tokenizer()
    common = {
        "vocab_size": len(tokenizer),
        "hidden_size": 64 if head_dim == 16 else 128,
        "intermediate_size": 128 if head_dim == 16 else 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4 if head_dim == 16 else 2,
        "num_key_value_heads": 2 if head_dim == 16 else 1,
        "max_position_embeddings": 512 if head_dim == 16 else 4096,
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "tie_word_embeddings": False,
    }
    if arch == "llama":
        config = LlamaConfig(**common)
    elif arch == "qwen2_moe":
        config = Qwen2MoeConfig(
            **common,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
        )
    else:
        raise ValueError(f"arch: got {arch!r}, expected 'llama' or 'qwen2_moe'")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # random init gives near-uniform next-token distributions; sharpen them so sampling and
    # greedy decoding differ and stop tokens are sometimes hit
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)
    folder = Path(folder)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
