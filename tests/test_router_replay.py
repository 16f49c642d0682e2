"""Router replay (R3) on tiny random HF MoE models built from configs."""

import copy
import json

import numpy as np
import pytest
import torch
from transformers import (
    MixtralConfig,
    MixtralForCausalLM,
    OlmoeConfig,
    OlmoeForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from carl.systems.router_replay import RouterReplay, decode_routes, encode_routes, stack_routes
from carl.types import Segment, Trajectory

VOCAB = 101
EXPERT_CLASSES = ("Qwen3MoeExperts", "MixtralExperts", "OlmoeExperts")


def tiny_qwen3_moe(seed: int = 0) -> Qwen3MoeForCausalLM:
    torch.manual_seed(seed)
    config = Qwen3MoeConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, moe_intermediate_size=32,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, max_position_embeddings=128,
        initializer_range=0.2, tie_word_embeddings=False,
    )  # fmt: skip
    return Qwen3MoeForCausalLM(config).eval()


def tiny_mixtral() -> MixtralForCausalLM:
    torch.manual_seed(0)
    config = MixtralConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=64,
        eos_token_id=0, initializer_range=0.2,
    )  # fmt: skip
    return MixtralForCausalLM(config).eval()


def tiny_olmoe() -> OlmoeForCausalLM:
    torch.manual_seed(0)
    config = OlmoeConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_experts=8, num_experts_per_tok=2, max_position_embeddings=64,
        eos_token_id=0, pad_token_id=1, initializer_range=0.2,
    )  # fmt: skip
    return OlmoeForCausalLM(config).eval()


class ExpertSpy:
    """Captures what each experts module actually receives: (hidden_N_H, expert_ids_N_K, weights_N_K)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.calls: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self._handles = [
            m.register_forward_pre_hook(self._capture)
            for m in model.modules()
            if type(m).__name__ in EXPERT_CLASSES
        ]

    def _capture(self, module, args):
        self.calls.append(tuple(a.detach().clone() for a in args[:3]))

    def expert_ids_L_B_T_K(self, num_rows: int) -> np.ndarray:
        return torch.stack([ids.reshape(num_rows, -1, ids.shape[-1]) for _, ids, _ in self.calls]).numpy()

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


def logprobs_of(logits_B_T_V: torch.Tensor, tokens_B_T: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits_B_T_V.float(), dim=-1).gather(-1, tokens_B_T[..., None])[..., 0]


def test_replay_removes_rollout_training_route_mismatch():
    """bf16 rollout (KV-cache generation) vs fp32 training forward: routes and log-probs differ
    without replay; with replay the experts see exactly the rollout routes, the log-prob gap
    shrinks, and gradients reach every router."""
    train_model = tiny_qwen3_moe()
    rollout_model = copy.deepcopy(train_model).to(torch.bfloat16)
    num_rows, prompt_len, num_new = 8, 16, 16
    torch.manual_seed(1)
    prompt_B_P = torch.randint(2, VOCAB, (num_rows, prompt_len))

    with RouterReplay(rollout_model).record() as recording, torch.no_grad():
        out = rollout_model.generate(
            prompt_B_P, attention_mask=torch.ones_like(prompt_B_P), max_new_tokens=num_new, do_sample=True,
            top_k=0, top_p=1.0, return_dict_in_generate=True, output_logits=True, pad_token_id=0, eos_token_id=None,
        )  # fmt: skip
    seq_B_T = out.sequences
    gen_B_N = seq_B_T[:, prompt_len:]
    rollout_lp_B_N = logprobs_of(torch.stack(out.logits, dim=1), gen_B_N)
    rollout_ids = recording.expert_ids_L_B_T_K()
    # prefill + one step per new token but the last: the last sampled token is never fed back.
    assert recording.num_steps == num_new
    assert rollout_ids.shape == (3, num_rows, prompt_len + num_new - 1, 2)
    routes_L_B_T_K = stack_routes([rollout_ids[:, b] for b in range(num_rows)], seq_B_T.shape[1])

    replay = RouterReplay(train_model)

    def training_forward(use_replay: bool) -> tuple[torch.Tensor, np.ndarray]:
        spy = ExpertSpy(train_model)
        if use_replay:
            with replay.replay(routes_L_B_T_K):
                logits = train_model(seq_B_T).logits
        else:
            logits = train_model(seq_B_T).logits
        spy.remove()
        used_ids = spy.expert_ids_L_B_T_K(num_rows)[:, :, :-1]  # the positions the rollout recorded
        return logprobs_of(logits[:, prompt_len - 1 : -1], gen_B_N), used_ids

    with torch.no_grad():
        free_lp, free_ids = training_forward(use_replay=False)
        replay_lp, replay_ids = training_forward(use_replay=True)

    same_experts = (np.sort(free_ids, axis=-1) == np.sort(rollout_ids, axis=-1)).all(axis=-1)
    assert not same_experts.all(), "bf16 vs fp32 should flip some routes"
    assert (replay_ids == rollout_ids).all()
    free_gap = (free_lp - rollout_lp_B_N).abs()
    replay_gap = (replay_lp - rollout_lp_B_N).abs()
    assert replay_gap.mean() < 0.7 * free_gap.mean()
    assert replay_gap.max() < free_gap.max()

    with replay.replay(routes_L_B_T_K):
        lp = logprobs_of(train_model(seq_B_T).logits[:, prompt_len - 1 : -1], gen_B_N)
    (-lp.sum()).backward()
    routers = [m for m in train_model.modules() if type(m).__name__ == "Qwen3MoeTopKRouter"]
    assert len(routers) == 3 and all(
        r.weight.grad is not None and r.weight.grad.abs().sum() > 0 for r in routers
    )


def test_recording_across_kv_cache_steps_matches_one_full_forward():
    model = tiny_qwen3_moe(seed=3)
    replay = RouterReplay(model)
    torch.manual_seed(2)
    prompt_B_P = torch.randint(2, VOCAB, (2, 7))
    with replay.record() as during_generation, torch.no_grad():
        seq_B_T = model.generate(
            prompt_B_P, attention_mask=torch.ones_like(prompt_B_P), max_new_tokens=6, do_sample=False,
            pad_token_id=0, eos_token_id=None,
        )  # fmt: skip
    with replay.record() as full_forward, torch.no_grad():
        model(seq_B_T[:, :-1])
    incremental = np.sort(during_generation.expert_ids_L_B_T_K(), axis=-1)
    full = np.sort(full_forward.expert_ids_L_B_T_K(), axis=-1)
    assert incremental.shape == full.shape == (3, 2, 12, 2)
    assert (incremental == full).all()


@pytest.mark.parametrize(
    "build", [tiny_qwen3_moe, tiny_mixtral, tiny_olmoe], ids=["qwen3_moe", "mixtral", "olmoe"]
)
def test_replay_forces_experts_and_gates_are_training_softmax(build):
    model = build()
    replay = RouterReplay(model)
    num_rows, num_tokens = 2, 5
    rng = np.random.default_rng(0)
    # distinct experts per token, drawn at random (mostly not the model's own choice)
    routes_L_B_T_K = np.stack(
        [rng.permutation(8)[:2] for _ in range(replay.num_layers * num_rows * num_tokens)]
    ).reshape(replay.num_layers, num_rows, num_tokens, 2)
    tokens_B_T = torch.randint(2, VOCAB, (num_rows, num_tokens))
    routers = [
        child for m in model.modules() for child in m.children() if "TopKRouter" in type(child).__name__
    ]

    spy = ExpertSpy(model)
    with replay.replay(routes_L_B_T_K):
        logits = model(tokens_B_T).logits
    spy.remove()
    assert (spy.expert_ids_L_B_T_K(num_rows) == routes_L_B_T_K).all()
    for router, (hidden_N_H, ids_N_K, weights_N_K) in zip(routers, spy.calls, strict=True):
        probs_N_E = torch.softmax(hidden_N_H.float() @ router.weight.float().T, dim=-1)
        expected_N_K = probs_N_E.gather(-1, ids_N_K)
        if getattr(router, "norm_topk_prob", True):  # OLMoE's default is False, Mixtral always renormalises
            expected_N_K = expected_N_K / expected_N_K.sum(-1, keepdim=True)
        torch.testing.assert_close(weights_N_K.float(), expected_N_K, rtol=1e-5, atol=1e-6)

    logits.float().logsumexp(-1).sum().backward()
    assert all(r.weight.grad is not None and r.weight.grad.abs().sum() > 0 for r in routers)


def test_unrecorded_positions_route_freely():
    model = tiny_qwen3_moe()
    replay = RouterReplay(model)
    tokens_B_T = torch.randint(2, VOCAB, (2, 6))
    with torch.no_grad():
        with replay.record() as rec:
            expected = model(tokens_B_T).logits
        # replaying the model's own routes, or no routes at all (-1), changes nothing
        with replay.replay(rec.expert_ids_L_B_T_K()):
            same_routes = model(tokens_B_T).logits
        with replay.replay(np.full((3, 2, 6, 2), -1)):
            no_routes = model(tokens_B_T).logits
    torch.testing.assert_close(same_routes, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(no_routes, expected, rtol=0, atol=0)


def test_replay_rejects_mismatched_routes():
    model = tiny_qwen3_moe()
    replay = RouterReplay(model)
    tokens_B_T = torch.randint(2, VOCAB, (2, 6))
    with pytest.raises(ValueError, match=r"shape \(3, B, T, 2\)"), replay.replay(np.zeros((2, 2, 6, 2))):
        pass
    with pytest.raises(ValueError, match=r"\[0, 8\)"), replay.replay(np.full((3, 2, 6, 2), 8)):
        pass
    with (
        pytest.raises(ValueError, match="got 12 tokens but the replayed routes"),
        replay.replay(np.zeros((3, 2, 5, 2))),
    ):
        model(tokens_B_T)
    with (
        pytest.raises(RuntimeError, match="do not nest"),
        replay.record(),
        replay.replay(np.zeros((3, 2, 6, 2))),
    ):
        pass
    # hooks are gone after a failed block: a plain forward works again
    model(tokens_B_T)
    assert not any(r._forward_hooks for r in model.modules() if type(r).__name__ == "Qwen3MoeTopKRouter")


def test_route_encoding_round_trips_through_a_trajectory():
    rng = np.random.default_rng(0)
    ids_L_T_K = rng.integers(0, 128, size=(4, 50, 8)).astype(np.int16)
    ids_L_T_K[:, -1] = -1  # the last sampled token has no route
    routing = encode_routes(ids_L_T_K, num_experts=128)
    assert routing["dtype"] == "uint8"
    assert len(routing["data"]) <= 4 * ids_L_T_K.size // 3 + 4  # one byte per id, base64
    trajectory = Trajectory(task_id="t", segments=[Segment(token_ids_T=list(range(50)), routing=routing)])
    restored = Trajectory.from_dict(json.loads(json.dumps(trajectory.to_dict())))
    decoded = decode_routes(restored.segments[0].routing)
    assert decoded.dtype == np.int16 and (decoded == ids_L_T_K).all()

    many_experts = rng.integers(0, 300, size=(2, 5, 4)).astype(np.int16)
    routing = encode_routes(many_experts, num_experts=300)
    assert routing["dtype"] == "uint16" and (decode_routes(routing) == many_experts).all()
    with pytest.raises(ValueError, match=r"\[0, 128\)"):
        encode_routes(ids_L_T_K + 1, num_experts=128)


def test_stack_routes_pads_with_no_route():
    a = np.zeros((2, 3, 2), dtype=np.int16)
    b = np.ones((2, 5, 2), dtype=np.int16)
    stacked = stack_routes([a, b], num_tokens=6)
    assert stacked.shape == (2, 2, 6, 2)
    assert (
        (stacked[:, 0, 3:] == -1).all() and (stacked[:, 1, :5] == 1).all() and (stacked[:, 1, 5] == -1).all()
    )
    with pytest.raises(ValueError, match="7 tokens > 6"):
        stack_routes([np.zeros((2, 7, 2), dtype=np.int16)], num_tokens=6)


def test_replay_survives_gradient_checkpointing_recompute():
    model = tiny_qwen3_moe()
    model.activation_checkpointing_enable()
    model.train()
    replay = RouterReplay(model)
    tokens_B_T = torch.randint(2, VOCAB, (2, 6))
    routes_L_B_T_K = np.tile(np.array([3, 5]), (3, 2, 6, 1))
    spy = ExpertSpy(model)
    with replay.replay(routes_L_B_T_K):
        model(tokens_B_T).logits.float().logsumexp(-1).sum().backward()
    spy.remove()
    assert len(spy.calls) == 6  # 3 layers in the forward, 3 again when backward recomputes them
    assert all((ids == torch.tensor([3, 5])).all() for _, ids, _ in spy.calls)
    assert all(
        m.weight.grad.abs().sum() > 0 for m in model.modules() if type(m).__name__ == "Qwen3MoeTopKRouter"
    )


def test_the_engine_records_routes_through_the_harness_and_rl_step_replays_them(tmp_path):
    """R3 in the loop: the HF engine (bf16, with carl.engine.routing's recorder) samples a two-turn
    segment through the harness's TokenContext; the segment keeps its routes; the fp32 trainer's
    rl_step replays them. The engine-vs-trainer log-prob gap on the sampled tokens shrinks with
    replay, and the trainer's own router would have routed some tokens elsewhere."""
    from tiny_hf import tiny_tokenizer

    from carl.engine.hf import HFEngine, HFEngineConfig, load_model
    from carl.engine.routing import recorder_for, segment_routes
    from carl.harness.chat_tokens import TokenContext
    from carl.rl.logprobs import sequence_logprobs
    from carl.rollout.rollout import Rollout
    from carl.tasks import TaskRecord
    from carl.train.config import RLConfig
    from carl.train.step import rl_step
    from carl.types import Message, Trajectory

    tok = tiny_tokenizer()
    torch.manual_seed(0)
    config = Qwen3MoeConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=8, num_experts_per_tok=2,
        norm_topk_prob=True, max_position_embeddings=512, initializer_range=0.2, tie_word_embeddings=False,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    Qwen3MoeForCausalLM(config).save_pretrained(tmp_path / "moe")
    tok.save_pretrained(tmp_path / "moe")
    recorder = recorder_for(tmp_path / "moe")
    assert recorder is not None and (recorder.top_k, recorder.num_experts) == (2, 8)
    engine = HFEngine(HFEngineConfig(path=str(tmp_path / "moe"), dtype="bfloat16", temperature=1.0), recorder)
    ctx = TokenContext(engine)
    ctx.start([Message("system", "You are a coding agent."), Message("user", "Fix the failing tests.")])
    ctx.generate(24, 10_000)
    ctx.add(Message("tool", "2 failed, 3 passed"))
    ctx.generate(24, 10_000)
    engine.close()
    seg = ctx.segment
    assert len(seg.routing["spans"]) == 2
    routes = segment_routes(seg.routing, len(seg.token_ids_T), 3, 2)
    assert routes.shape == (3, len(seg.token_ids_T), 2) and (routes[:, :-1] >= 0).mean() > 0.8

    _, trainer = load_model(tmp_path / "moe", torch.float32)
    replay = RouterReplay(trainer)
    ids = torch.tensor([seg.token_ids_T])
    mask = torch.tensor([seg.generated_mask_T])
    engine_lp = torch.tensor(seg.logprobs_T)[mask[0]]
    with torch.no_grad():
        free = sequence_logprobs(trainer, ids, torch.ones_like(ids))[0][mask[0]]
        with replay.replay(stack_routes([routes], ids.shape[1])):
            replayed = sequence_logprobs(trainer, ids, torch.ones_like(ids))[0][mask[0]]
    assert (replayed - engine_lp).abs().mean() < (free - engine_lp).abs().mean()

    task = TaskRecord(instance_id="moe__0", repo="moe")
    group = [Rollout(task, Trajectory(task_id="moe__0", segments=[seg]), reward=r, passed=r > 0) for r in (1.0, 0.0)]
    trainer.requires_grad_(True)
    opt = torch.optim.AdamW(trainer.parameters(), lr=1e-3)
    m = rl_step(trainer, opt, None, [group], RLConfig(), tok, tok.pad_token_id, 64.0, replay=replay)
    assert m["replay/micro_batches"] >= 1 and "replay/micro_batches_free" not in m
    assert 0.0 < m["replay/route_mismatch_frac"] < 1.0  # the trainer alone would have routed some elsewhere
