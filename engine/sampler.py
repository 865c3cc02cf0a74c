"""Choosing next tokens from logits: greedy, temperature / top-k / top-p, n parallel samples
and beam search.

Seeding (so a request's tokens do not depend on batch composition, preemption or device):
every random draw uses a fresh ``torch.Generator`` seeded from ``(sample seed, position)``,
where *position* is the index of the token being drawn (``seq.num_tokens``) and the *sample
seed* of sample ``i`` of a request is ``base + i`` with ``base = SamplingParams.seed``, or
a hash of the engine seed and the request id when the request gives none. So sample ``i``
of a request with ``n > 1`` and seed ``s`` draws exactly what a single-sample request with
seed ``s + i`` and the same prompt draws. Random draws run on the CPU from the row's fp32
logits, so a seed gives the same tokens whatever the device.

Beam search (``beam_width = k``): for the group's live beams, candidates are
``cum_logprob + log_softmax(logits)`` over the vocabulary; the top ``k`` ``(parent, token)``
pairs across all beams survive. Ties break by beam order (the group's live-sequence
order), then by token id (a stable sort). EOS is ignored (output lengths come from the
trace), so the score is the plain cumulative log-probability.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from core.plan import BeamChoice
from core.request import Sequence, SequenceGroup
from core.seeding import mix_seed


@dataclass
class Samples:
    """The sampler's part of a ``StepOutcome``."""

    token_ids: dict[int, int] = field(default_factory=dict)
    extra_samples: dict[int, list[int]] = field(default_factory=dict)
    beams: list[BeamChoice] = field(default_factory=list)


class Sampler:
    """Stateless across steps: every draw is seeded from the request and position."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def base_seed(self, group: SequenceGroup) -> int:
        """Sample 0's seed of the request (sample ``i`` uses this plus ``i``). A child of a
        :class:`~core.request.ParentRequest` (vLLM V1's requests of one sample) is its
        parent's sample ``group.sample_index``: its request's seed is the parent's plus that
        index already (:func:`~core.request.child_request`), else the index is added to the
        parent's drawn seed, so its tokens are those of the same sample of a forked group."""
        seed = group.sampling.seed
        if seed is not None:
            return seed
        return mix_seed(self.seed, group.request_id) + group.sample_index

    def sample(self, seqs: list[Sequence], logits: torch.Tensor) -> Samples:
        """Tokens for ``seqs`` (row ``i`` of ``logits [len(seqs), vocab]`` is ``seqs[i]``)."""
        if logits.dim() != 2 or logits.shape[0] != len(seqs):
            raise ValueError(
                f"logits {tuple(logits.shape)} do not match {len(seqs)} sampling sequences"
            )
        out = Samples()
        if not seqs:
            return out
        greedy = logits.argmax(dim=-1).tolist()
        beam_rows: dict[int, list[int]] = {}
        random_rows = [
            i
            for i, s in enumerate(seqs)
            if not s.group.sampling.greedy and not s.group.sampling.use_beam_search
        ]
        cpu = logits[random_rows].float().cpu() if random_rows else None
        cpu_row = {row: j for j, row in enumerate(random_rows)}
        for i, seq in enumerate(seqs):
            params = seq.group.sampling
            if params.use_beam_search:
                beam_rows.setdefault(id(seq.group), []).append(i)
                out.token_ids[seq.seq_id] = greedy[i]  # placeholder; the BeamChoice decides
                continue
            first_of_n = params.n > 1 and len(seq.group.seqs) == 1
            count = params.n if first_of_n else 1
            index = 0 if first_of_n else seq.group.seqs.index(seq)
            if params.greedy:
                tokens = [greedy[i]] * count
            else:
                assert cpu is not None
                base = self.base_seed(seq.group)
                tokens = [self._draw(cpu[cpu_row[i]], seq, base + index + k) for k in range(count)]
            out.token_ids[seq.seq_id] = tokens[0]
            if first_of_n:
                out.extra_samples[seq.seq_id] = tokens[1:]
        for rows in beam_rows.values():
            out.beams.append(self._beam_choice([seqs[r] for r in rows], logits[rows]))
        return out

    @staticmethod
    def _draw(row: torch.Tensor, seq: Sequence, sample_seed: int) -> int:
        params = seq.group.sampling
        scaled = row / params.temperature
        if params.top_k > 0 and params.top_k < scaled.numel():
            kth = torch.topk(scaled, params.top_k).values[-1]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        probs = torch.softmax(scaled, dim=-1)
        if params.top_p < 1.0:
            sorted_p, order = torch.sort(probs, descending=True, stable=True)
            before = torch.cumsum(sorted_p, dim=-1) - sorted_p  # mass strictly ahead
            drop = order[before >= params.top_p]
            probs = probs.index_fill(0, drop, 0.0)
        gen = torch.Generator().manual_seed(mix_seed(sample_seed, seq.num_tokens))
        return int(torch.multinomial(probs, 1, generator=gen))

    @staticmethod
    def _beam_choice(beams: list[Sequence], logits: torch.Tensor) -> BeamChoice:
        group = beams[0].group
        live = group.live_seqs()
        if len(beams) != len(live):
            raise ValueError(
                f"request {group.request_id}: {len(beams)} of its {len(live)} beams sample "
                "this step; beam search needs all beams of a group in one step"
            )
        width = group.sampling.beam_width
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        cum = torch.tensor([b.cum_logprob for b in beams], dtype=torch.float64)
        scores = (cum[:, None].to(logprobs.device) + logprobs.double()).flatten()
        values, flat = torch.sort(scores, descending=True, stable=True)
        vocab = logits.shape[1]
        top = flat[:width].tolist()
        return BeamChoice(
            group,
            beams=[(beams[f // vocab].seq_id, f % vocab) for f in top],
            scores=values[:width].tolist(),
        )
