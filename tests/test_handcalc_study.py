"""kvlab's numbers against ones computed by hand from the documented model (a hand check).

Every expected number here was derived outside kvlab, step by step on paper (or in a
throwaway script written from the README and the module docstrings it names, before the
code was read), not copied from a run:

- KV capacity: ``usable = 0.9 × memory_gb GiB``; ``weights = params × 2 B``; activations
  ``max(T (2h + max(qkv, mlp)) × 2 B, rows × vocab × 20 B + T h × 2 B)`` (``sim/capacity.py``);
  K/V bytes per token ``2 × layers × kv_heads × head_dim × 2 B``;
- the schedulers on a hand-sized trace with every step priced at 1 s (a 1-s per-step
  overhead on tiny-opt, whose operators take well under a microsecond), so time-weighted
  shares are step means; vLLM's watermark is ``int(0.01 × blocks)`` blocks (0 here);
- a roofline step: linear part ``max(F / (312e12 × 0.72), B / (1555e9 × 0.88))`` plus the
  attention part likewise (``sim/cost/roofline.py``, ``sim/cost/work.py``).
"""

from __future__ import annotations

import pytest

from core.request import Request
from experiments.simulate import simulate_requests
from sim.capacity import kv_capacity

GIB = 2**30

# (id, arrival s, prompt, output)
ORCA_TRACE = [(0, 0.0, 6, 10), (1, 0.0, 5, 7), (2, 0.0, 9, 3), (3, 2.5, 3, 12)]
VLLM_TRACE = [(0, 0.0, 4, 12), (1, 0.0, 4, 10), (2, 0.0, 3, 6), (3, 2.5, 8, 2)]
ONE_SECOND_STEPS = ["model=tiny-opt", "system.block_size=4", "cost.per_step_overhead_s=1.0"]


def _requests(rows: list[tuple[int, float, int, int]]) -> list[Request]:
    return [Request(i, t, p, o) for i, t, p, o in rows]


def _share(slot_steps: int, steps: int, slots: int) -> float:
    return 100 * slot_steps / (steps * slots)


# Hand traces (block 4, 16 blocks = 64 slots, one buddy root, max_model_len 32).
# Reservations (buddy-rounded): max 32 each; pow2 P + next_pow2(O) capped at 32:
# 22->32, 13->16, 13->16, 19->32; oracle P + O: 16, 12->16, 12->16, 15->16.
# Token states per step are P + tokens generated so far; summed over a request's steps
# that is sum_k (P + k), k < O: 293 slot-steps in all, whatever the schedule; reserved is
# (P + O) - S: 167. Max runs two at a time (R2 waits for R1, R3 for both); Pow2 holds
# 32+16+16 until R2 frees at step 2, R3 waits for a 32-slot hole until R1 (step 6) ends;
# Oracle admits R3 at its first step boundary, step 3.
ORCA_HAND = {
    # system: steps, finish steps, (token, reserved, internal, external, free) slot-steps
    "orca_max": (22, [9, 6, 9, 21], (293, 167, 564, 0, 384)),
    "orca_pow2": (19, [9, 6, 2, 18], (293, 167, 118, 350, 288)),
    "orca_oracle": (15, [9, 6, 2, 14], (293, 167, 0, 52, 448)),
}


@pytest.mark.parametrize("system", sorted(ORCA_HAND))
def test_orca_schedule_and_breakdown_match_the_hand_trace(system: str) -> None:
    steps, finish, parts = ORCA_HAND[system]
    run = simulate_requests(
        _requests(ORCA_TRACE),
        [f"system={system}", "system.max_model_len=32", "num_gpu_blocks=16", *ONE_SECOND_STEPS],
    )
    m = run.metrics
    assert len(run.steps) == steps
    assert run.requests.sort_values("request_id")["finish_step"].tolist() == finish
    keys = ["kv_token_states_pct", "kv_reserved_pct", "kv_internal_frag_pct"]
    keys += ["kv_external_frag_pct", "kv_free_pct"]
    for key, slot_steps in zip(keys, parts, strict=True):
        assert m[key] == pytest.approx(_share(slot_steps, steps, 64), abs=1e-4), key


def test_vllm_recompute_trace_matches_the_hand_trace() -> None:
    """5 blocks of 4 (20 slots), watermark int(0.05) = 0 blocks. Step 0 admits all three
    prompts (1+1+1 blocks); step 1 grows R0, R1 to 2 blocks each (free 0); step 2 R2 needs a
    block: preempted (latest arrival); step 5 R0 takes the last block and R1, the latest
    running, is preempted; R0 alone to step 11; step 12 re-admits R1 (4+5 tokens, 3 blocks)
    and R2 (3+2, 2 blocks: free - need = 0 >= 0); R2 ends at 15, R3 (8 tokens, 2 blocks) is
    admitted at 16 and preempted at 17 when R1 needs its 13th slot; R1 ends at 17, R3
    recomputes its 9 tokens at 18 and ends. A watermark kept as 0.05 blocks (not rounded
    down) would refuse step 12's second admission: 21 steps."""
    run = simulate_requests(
        _requests(VLLM_TRACE),
        ["system=vllm", "system.max_model_len=16", "num_gpu_blocks=5", *ONE_SECOND_STEPS],
    )
    m = run.metrics
    req = run.requests.sort_values("request_id")
    assert len(run.steps) == 19
    assert req["finish_step"].tolist() == [11, 17, 15, 18]
    assert req["num_preemptions"].tolist() == [0, 1, 1, 1]
    expected = {"kv_token_states_pct": 261, "kv_internal_frag_pct": 43}
    expected |= {"kv_external_frag_pct": 60, "kv_free_pct": 16, "kv_reserved_pct": 0}
    for key, slot_steps in expected.items():
        assert m[key] == pytest.approx(_share(slot_steps, 19, 20), abs=1e-4), key


def _opt13b_roofline_step(prefill: int = 0, pairs: int = 0, decode_ctx: int = 0) -> float:
    """One step of OPT-13B on an A100-40GB on the bare roofline, written from
    ``sim/cost/work.py``'s docstrings: matmul weights only (q, k, v, o, fc1, fc2; biases and
    norms are not counted), per-token activations ``4h + 4q + 4 ffn + 2 kv``, the LM head
    once per sampled row."""
    h, layers, ffn, vocab = 5120, 40, 20480, 50272
    flops_s, bytes_s = 312e12 * 0.72, 1555e9 * 0.88
    matmul = 4 * h * h + 2 * h * ffn
    act = 4 * h + 4 * h + 4 * ffn + 2 * h
    rows = prefill + (1 if decode_ctx else 0)
    sampled = 1
    lin_f = 2 * matmul * layers * rows + 2 * h * vocab * sampled
    lin_b = 2 * (matmul * layers + h * vocab + act * layers * rows + (h + vocab) * sampled)
    att_f = 4 * h * layers * (pairs + decode_ctx)
    att_b = 2 * 2 * h * layers * (decode_ctx + rows)
    return max(lin_f / flops_s, lin_b / bytes_s) + max(att_f / flops_s, att_b / bytes_s)


def test_roofline_step_times_match_the_hand_formula() -> None:
    run = simulate_requests(
        [Request(0, 0.0, 512, 3)], ["system=vllm", "model=opt-13b", "hardware=a100-40gb"]
    )
    hand = [_opt13b_roofline_step(prefill=512, pairs=512 * 513 // 2)]
    hand += [_opt13b_roofline_step(decode_ctx=c) for c in (513, 514)]
    assert run.steps["duration_s"].tolist() == pytest.approx(hand, rel=1e-12)
    # 57.84 ms compute-bound prefill; 19.08 ms decodes, 0.599 us more per context token
    assert hand[0] == pytest.approx(57.839e-3, abs=1e-6)
    assert hand[2] - hand[1] == pytest.approx(2 * 40 * 5120 * 2 / (1555e9 * 0.88))


@pytest.mark.parametrize(
    ("model", "gpu", "max_len", "params", "per_token", "act", "slots"),
    [
        # OPT-13B: 12,853,473,280 params; sampler peak 256 x 50272 x 20 B + 2560 x 5120 x 2 B
        # beats the forward's 2560 x (2 x 5120 + 2 x 20480) x 2 B
        (
            "opt-13b",
            "a100-40gb",
            2048,
            12_853_473_280,
            819_200,
            256 * 50272 * 20 + 2560 * 5120 * 2,
            15_459,
        ),
        # Llama-3.1-8B (GQA, 8 KV heads of 128): the forward of 8192 tokens,
        # 8192 x (2 x 4096 + 3 x 14336) x 2 B, beats the sampler
        (
            "llama-3.1-8b",
            "l40s",
            8192,
            8_030_261_248,
            131_072,
            8192 * (2 * 4096 + 3 * 14336) * 2,
            224_962,
        ),
    ],
)
def test_kv_capacity_matches_the_hand_count(
    model: str,
    gpu: str,
    max_len: int,
    params: int,
    per_token: int,
    act: int,
    slots: int,
) -> None:
    tokens = max(2560, max_len)
    memory_gib = {"a100-40gb": 40, "l40s": 48}[gpu]
    kv = 0.9 * memory_gib * GIB - params * 2 - act
    assert int(kv // per_token) == slots
    cap = kv_capacity(model, gpu, max_num_batched_tokens=tokens, max_model_len=max_len)
    assert cap.bytes_per_token_per_gpu == per_token
    assert cap.weight_bytes == params * 2
    assert cap.activation_bytes == act
    assert cap.num_slots == slots
    assert cap.num_blocks(16) == slots // 16
