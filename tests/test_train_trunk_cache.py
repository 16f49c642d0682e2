"""The warm start's frozen-trunk cache (carl.train.warm_start.TrunkCache) on a tiny random Llama
with block 1 of 2 trained: the same losses and weights as full passes, the frozen block skipped,
the shared prompt run once, and the checks that turn the cache off where its passes would differ."""

import pytest
import torch
from tiny_hf import save_tiny_model, tiny_tokenizer
from train_fakes import failed_rollout, solved_rollout, token_rollout, tokens_through

from carl.engine.hf import load_model
from carl.train.loop import set_trainable


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    torch.set_num_threads(1)
    return save_tiny_model(tmp_path_factory.mktemp("tiny"))


def _warm_start(tiny_dir, trunk_cache: bool, epochs: int = 3, patch=None, data=None, share_prefix=False,
                micro_batch_tokens=60, compute_dtype=None, fill=False, tokens=None):
    """(per-epoch losses, final weights, calls of the frozen block per epoch, the cache) of a
    warm start with block 1 of 2 trained, with or without the frozen-trunk cache; with `fill`, the
    cache keeps every sequence's states before the first epoch (counted in its calls). `tokens`:
    a list that gets the tokens through the frozen block per epoch."""
    import random

    from carl.train.warm_start import TrunkCache, sft_epoch, sft_sequences

    tok = tiny_tokenizer()
    _, model = load_model(tiny_dir, torch.float32)
    optimizer = torch.optim.AdamW(set_trainable(model, 1), lr=3e-3)
    if patch is not None:
        patch(model)
    calls = [0]
    model.model.layers[0].register_forward_pre_hook(lambda m, a: calls.__setitem__(0, calls[0] + 1))
    seen = tokens_through(model)
    rng = random.Random(0)
    if data is None:
        data = [token_rollout([rng.randrange(3, 300) for _ in range(n)], [t >= n // 2 for t in range(n)], reward=1.0)
                for n in (18, 25, 31, 40)] + [failed_rollout(tok)]  # 4 sequences to learn, one not
    trunk = TrunkCache(model, 1) if trunk_cache else None
    losses, frozen_calls = [], []
    for e in range(epochs):
        calls[0] = seen[0] = 0
        if e == 0 and fill:
            trunk.fill(sft_sequences(data), tok.pad_token_id, micro_batch_tokens, compute_dtype)
            if tokens is not None:
                tokens.append(seen[0])  # fill's, before epoch 1's
                seen[0] = 0
        losses.append(sft_epoch(model, optimizer, data, tok.pad_token_id, batch_size=2,
                                micro_batch_tokens=micro_batch_tokens, grad_clip=1.0, rng=random.Random(e), trunk=trunk,
                                share_prefix=share_prefix, compute_dtype=compute_dtype))
        frozen_calls.append(calls[0])
        if tokens is not None:
            tokens.append(seen[0])
    return losses, model.state_dict(), frozen_calls, trunk


def test_the_trunk_cache_trains_the_same_weights_without_rerunning_the_frozen_blocks(tiny_dir):
    losses, weights, calls, _ = _warm_start(tiny_dir, trunk_cache=False)
    cached_losses, cached_weights, cached_calls, trunk = _warm_start(tiny_dir, trunk_cache=True)
    assert calls[0] == cached_calls[0] > 1  # epoch 1 runs (and keeps) the trunk, in several micro-batches
    assert cached_calls[1:] == [0, 0] and calls[1:] == [calls[0]] * 2
    assert trunk.enabled and len(trunk.hidden) == 4 and trunk.bytes > 0  # the solved rollouts' sequences
    torch.testing.assert_close(cached_losses, losses, rtol=1e-4, atol=1e-5)
    for name in weights:
        torch.testing.assert_close(cached_weights[name], weights[name], rtol=1e-4, atol=1e-5)


def test_the_trunk_cache_turns_itself_off_where_the_top_blocks_alone_differ(tiny_dir):
    """An architecture that treats `inputs_embeds` unlike embedded ids (here: scaled by 2) fails the
    first micro-batch's check: every pass stays full and the training is unchanged."""

    def scale_inputs_embeds(model):
        def hook(module, args, kwargs):
            if kwargs.get("inputs_embeds") is not None:
                kwargs["inputs_embeds"] = kwargs["inputs_embeds"] * 2
            return args, kwargs

        model.model.register_forward_pre_hook(hook, with_kwargs=True)

    losses, weights, calls, _ = _warm_start(tiny_dir, trunk_cache=False, epochs=2)
    got_losses, got_weights, got_calls, trunk = _warm_start(tiny_dir, trunk_cache=True, epochs=2,
                                                            patch=scale_inputs_embeds)
    assert not trunk.enabled and trunk.hidden == {} and got_calls == calls
    torch.testing.assert_close(got_losses, losses)
    for name in weights:
        torch.testing.assert_close(got_weights[name], weights[name])


def test_the_trunk_cache_kept_before_the_first_epoch_trains_the_same_weights(tiny_dir):
    """`TrunkCache.fill`: every sequence's trunk states before epoch 1, whose micro-batches then
    skip the frozen block too, except the first (the check's full pass)."""
    losses, weights, calls, _ = _warm_start(tiny_dir, trunk_cache=False)
    got_losses, got_weights, got_calls, trunk = _warm_start(tiny_dir, trunk_cache=True, fill=True)
    assert trunk.enabled and trunk.checked and len(trunk.hidden) == 4
    assert got_calls[1:] == [0, 0] and 1 < got_calls[0] < 1 + calls[0]  # fill's passes + one full micro-batch
    torch.testing.assert_close(got_losses, losses, rtol=1e-4, atol=1e-5)
    for name in weights:
        torch.testing.assert_close(got_weights[name], weights[name], rtol=1e-4, atol=1e-5)


def _prompted_data(prefix_len=40, lengths=(6, 9, 13, 20)):
    """Solved warm-start rollouts that all start with the same `prefix_len` tokens (a system prompt)."""
    prompt = torch.randint(3, 300, (prefix_len,), generator=torch.Generator().manual_seed(1000)).tolist()
    return [token_rollout(prompt + list(range(3 + i, 3 + i + n)), [False] * prefix_len + [t >= n // 2 for t in range(n)],
                          reward=1.0) for i, n in enumerate(lengths)]


def test_the_trunk_fill_runs_the_shared_prompt_through_the_trunk_once(tiny_dir):
    """With a prompt every sequence starts with, `fill` runs it once for the whole data set (epoch 1's
    full passes ran it once per micro-batch); the training is the same."""
    data = _prompted_data()
    epoch_tokens, filled_tokens = [], []
    losses, weights, _, _ = _warm_start(tiny_dir, trunk_cache=True, data=data, share_prefix=True, micro_batch_tokens=100,
                                        tokens=epoch_tokens)
    got_losses, got_weights, _, trunk = _warm_start(tiny_dir, trunk_cache=True, data=data, share_prefix=True,
                                                    micro_batch_tokens=100, fill=True, tokens=filled_tokens)
    assert trunk.enabled and trunk.share_ok
    fill_tokens, filled_epochs = filled_tokens[0], filled_tokens[1:]
    assert fill_tokens == 40 + 4 * 20  # the prompt once, then the 4 rests (6, 9, 13, 20 tokens) padded to 20
    assert filled_epochs[1:] == [0, 0] and epoch_tokens[1:] == [0, 0]
    # epoch 1: both ran the first micro-batch whole (the check); without fill the second one too, prompt included
    assert epoch_tokens[0] - filled_epochs[0] >= 40
    torch.testing.assert_close(got_losses, losses, rtol=1e-4, atol=1e-5)
    for name in weights:
        torch.testing.assert_close(got_weights[name], weights[name], rtol=1e-4, atol=1e-5)


def test_trunk_states_kept_before_the_epoch_that_differ_from_the_full_pass_turn_the_cache_off(tiny_dir, monkeypatch,
                                                                                             caplog):
    """A trunk pass that got the states wrong (here: scaled by 1.1) fails the first micro-batch's
    comparison with its full pass: the cache turns off before any update used them."""
    from carl.train.warm_start import TrunkCache

    losses, weights, calls, _ = _warm_start(tiny_dir, trunk_cache=False, epochs=2)
    right = TrunkCache._trunk_pass
    monkeypatch.setattr(TrunkCache, "_trunk_pass", lambda self, *a: right(self, *a) * 1.1)
    got_losses, got_weights, got_calls, trunk = _warm_start(tiny_dir, trunk_cache=True, epochs=2, fill=True)
    assert not trunk.enabled and trunk.hidden == {} and got_calls[1] == calls[1]
    assert "differ from the full pass's" in caplog.text
    torch.testing.assert_close(got_losses, losses)
    for name in weights:
        torch.testing.assert_close(got_weights[name], weights[name])


def test_the_trainer_keeps_the_trunk_for_the_warm_start_epochs_only(tiny_dir):
    """Trainer.sft_epoch: the first epoch fills the cache before it trains (`TrunkCache.fill`),
    every epoch skips the frozen block but for the first micro-batch's check, and the last one
    frees the states (nothing is held through RL)."""
    from carl.config import load_config
    from carl.train.config import TrainConfig
    from carl.train.trainer import Trainer

    tok = tiny_tokenizer()
    cfg = load_config(TrainConfig, None, [f"model.path={tiny_dir}", "model.dtype=float32", "model.trainable_layers=1",
                                          "warm_start.epochs=3"])
    trainer = Trainer(cfg, tiny_dir)
    calls = [0]
    trainer.model.model.layers[0].register_forward_pre_hook(lambda m, a: calls.__setitem__(0, calls[0] + 1))
    data = [solved_rollout(tok)]
    seen = []
    for epoch in range(3):
        calls[0] = 0
        trainer.sft_epoch(data, tok.pad_token_id, epoch)
        seen.append((calls[0], trainer._trunk is not None and len(trainer._trunk.hidden)))
    assert seen == [(2, 1), (0, 1), (0, False)]  # epoch 1: fill's pass and the check's
    trainer = Trainer(cfg, tiny_dir)  # the loop keeps the states first, under its own progress phase
    rows = []
    assert trainer.keeps_trunk() and trainer.keep_trunk(data * 2, tok.pad_token_id, on_rows=rows.append) == 1 == sum(rows)
    assert trainer.keep_trunk(data, tok.pad_token_id) == 0  # kept already
    one_epoch = load_config(TrainConfig, None, [f"model.path={tiny_dir}", "model.dtype=float32",
                                                "model.trainable_layers=1", "warm_start.epochs=1"])
    trainer = Trainer(one_epoch, tiny_dir)
    trainer.sft_epoch(data, tok.pad_token_id, 0)
    assert trainer._trunk is None  # freed after the last epoch


def test_the_trunk_cache_counts_each_sequence_once(tiny_dir):
    """The first micro-batch's check and a sequence seen twice keep no second copy."""
    _, _, _, trunk = _warm_start(tiny_dir, trunk_cache=True, epochs=1)
    assert trunk.bytes == sum(h.numel() * h.element_size() for h in trunk.hidden.values())
    assert all(h.device.type == "cpu" for h in trunk.hidden.values())


def test_the_warm_start_runs_a_shared_prompt_once_with_and_without_the_trunk_cache(tiny_dir):
    """Sequences that start with the same 80 tokens: the same losses and weights with the prompt
    run once per micro-batch (fewer tokens through the trained block in later epochs), and the trunk cache keeps the same
    states when its first epoch's passes are split in two (prefix, then the rows' rest)."""
    import random

    rng = random.Random(1)
    prompt = [rng.randrange(3, 300) for _ in range(80)]
    data = [token_rollout(prompt + [rng.randrange(3, 300) for _ in range(n)], [False] * 80 + [t >= n // 2 for t in range(n)],
                          reward=1.0) for n in (12, 15, 19, 24)]
    runs, tokens = {}, {}
    for trunk in (False, True):
        for share in (False, True):
            counted = []
            for epochs in (1, 3):  # the trained block's tokens in epochs 2-3 (the one-time checks cancel)
                counters = []
                runs[trunk, share] = _warm_start(tiny_dir, trunk, epochs=epochs, data=data, share_prefix=share,
                                                 micro_batch_tokens=150,
                                                 patch=lambda m: counters.append(tokens_through(m, block=-1)))
                counted.append(counters[0][0])
            tokens[trunk, share] = counted[1] - counted[0]
    losses, weights, _, _ = runs[False, False]
    for (trunk, share), (other_losses, other_weights, calls, cache) in runs.items():
        torch.testing.assert_close(other_losses, losses, rtol=1e-4, atol=1e-5)
        for name in weights:
            torch.testing.assert_close(other_weights[name], weights[name], rtol=1e-4, atol=1e-5)
        if trunk:
            assert cache.enabled and len(cache.hidden) == 4 and calls[1:] == [0, 0]
    assert tokens[False, True] < tokens[False, False] and tokens[True, True] < tokens[True, False]
    kept_full, kept_shared = runs[True, False][3].hidden, runs[True, True][3].hidden
    assert kept_full.keys() == kept_shared.keys()
    for key in kept_full:
        torch.testing.assert_close(kept_shared[key], kept_full[key], rtol=1e-5, atol=1e-5)


def test_the_trunk_cache_stays_on_where_shared_prompt_passes_differ_slightly(tiny_dir):
    """Under bf16 autocast a shared-prompt pass and a whole-row pass differ by more than the
    check's tolerance (here: bf16 autocast, and the logits of its passes on a cache scaled by 1.01
    so that the tiny model's difference is as large as a real one; the fp32 check of shared passes
    does not see it). The check
    compares the top blocks with the pass they replace (both shared), so the cache stays on and
    later epochs skip the frozen block. It once compared a whole-row top pass with the shared full
    pass, turned itself off on every bf16 run, and every warm-start epoch ran the whole model."""
    import random

    def shared_passes_differ(model):
        def hook(module, args, kwargs, out):
            on_cache = kwargs.get("cache") is not None or kwargs.get("past_key_values") is not None
            if on_cache and torch.is_autocast_enabled("cpu"):
                out.logits = out.logits * 1.01
            return out

        model.register_forward_hook(hook, with_kwargs=True)

    rng = random.Random(1)
    prompt = [rng.randrange(3, 300) for _ in range(80)]
    data = [token_rollout(prompt + [rng.randrange(3, 300) for _ in range(n)], [False] * 80 + [t >= n // 2 for t in range(n)],
                          reward=1.0) for n in (12, 15, 19, 24)]
    _, _, calls, cache = _warm_start(tiny_dir, True, epochs=2, data=data, share_prefix=True, micro_batch_tokens=150,
                                     patch=shared_passes_differ, compute_dtype=torch.bfloat16)
    assert cache.enabled and cache.share_ok and len(cache.hidden) == 4
    assert calls[0] > 0 and calls[1] == 0
