"""One policy, two bodies, fuzzed: for random small workloads on every shipped system (and
the example plugin), the simulator replaying the engine's measured step times (and beam
choices) makes the engine's steps and requests exactly (tests/test_two_bodies.py holds
the hand-picked cases)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pandas as pd
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from core.beam_log import RecordedBeams
from core.defaults import DEFAULT_WATERMARK
from core.request import Request, SamplingParams
from core.sched.base import BaseScheduler, SchedulerConfig
from core.systems import BUILT_IN, build_scheduler, get_system, load_plugin, paged_only_problem
from engine.engine import LLMEngine, RequestOutput
from engine.weights import init_dummy_weights
from sim.cost.recorded import RecordedCostModel
from sim.driver import simulate
from tests.engine_helpers import (
    TEST_STD,
    one_torch_thread,  # noqa: F401 (autouse fixture)
    prompt_ids,
    requests,
    tiny_config,
)

BLOCK = 4
MAX_LEN = 64
SPARE_STEPS = 500
PROMPT_LENS = (3, 16)
OUTPUT_LENS = (2, 12)


@dataclasses.dataclass(frozen=True)
class Case:
    """One fuzzed run: a system and its options, the device and CPU blocks, the requests."""

    system: str
    mode: str
    caching: bool
    chunked: bool
    num_blocks: int
    num_cpu_blocks: int
    max_num_seqs: int
    watermark: float
    reqs: tuple[Request, ...]

    def config(self) -> SchedulerConfig:
        return SchedulerConfig(
            max_num_seqs=self.max_num_seqs, max_num_batched_tokens=8 if self.chunked else 2560,
            max_model_len=MAX_LEN, preemption_mode=self.mode, chunked_prefill=self.chunked,
        )  # fmt: skip

    def describe(self) -> str:
        spec = [
            (r.prompt_len, r.output_len, r.arrival_time, r.sampling.n, r.sampling.beam_width,
             r.sampling.temperature, r.prompt_token_ids[:3])
            for r in self.reqs
        ]  # fmt: skip
        head = dataclasses.replace(self, reqs=())
        return f"{head}\nrequests (prompt, output, arrival, n, beams, temp, ids[:3]): {spec}"


@st.composite
def _requests(draw: st.DrawFn, beams: bool, caching: bool) -> tuple[Request, ...]:
    """3-8 requests: prompts of 3-16 tokens (some request 0's, some sharing its leading
    tokens), outputs of 2-12, arrivals at 0, a few ms apart or 30 s late, one sample (greedy
    or seeded), two samples (seeded by the request or its own seed) or, with ``beams``, two
    beams. With ``caching``, samples are seeded, never greedy: greedy sequences of one
    prompt generate the same tokens, whose blocks the engine's prefix cache shares and the
    simulator's cannot (a known limit: :func:`_engine_shares_more_blocks`)."""
    count = draw(st.integers(3, 8))
    soon = st.integers(1, 20).map(lambda ms: ms / 1000)
    arrival = st.one_of(st.just(0.0), soon, st.just(0.0), soon, st.just(30.0))
    kinds = ["one", "one", "two"] + (["beam"] if beams else [])
    out: list[Request] = []
    for i in range(count):
        plen = draw(st.integers(*PROMPT_LENS))
        ids = prompt_ids(plen, 100 + i)
        share = draw(st.sampled_from(["none", "prefix", "all"])) if out else "none"
        if share == "all":  # request 0's prompt
            plen, ids = out[0].prompt_len, out[0].prompt_token_ids
        elif share == "prefix":  # its leading tokens (prefix caching hits them)
            shared = draw(st.integers(1, min(plen, out[0].prompt_len)))
            ids = out[0].prompt_token_ids[:shared] + ids[shared:]
        kind = draw(st.sampled_from(kinds))
        seeded = caching or draw(st.booleans())
        temperature, seed = (1.0, 7 + i) if seeded else (0.0, None)
        if kind == "one":
            sampling = SamplingParams(temperature=temperature, seed=seed)
        elif kind == "two":  # greedy samples would be one sequence: refused
            sampling = SamplingParams(n=2, temperature=1.0, seed=seed)
        else:
            sampling = SamplingParams(beam_width=2)
        out.append(Request(i, draw(arrival), plen, draw(st.integers(*OUTPUT_LENS)), sampling, ids))
    return tuple(out)


@st.composite
def cases(draw: st.DrawFn, systems: list[str], beams: bool = False) -> Case:
    system = draw(st.sampled_from(systems))
    spec = get_system(system)
    paged = spec.kv == "paged"
    mode = draw(st.sampled_from(["recompute", "swap"])) if paged else "recompute"
    caching = paged and draw(st.booleans())
    chunked = paged and (spec.allocate_per_chunk or draw(st.booleans()))
    if paged_only_problem(system, mode, chunked, caching) is not None:
        mode = "recompute"
    # tight: a few requests at once (preemption, or waiting for a reservation); roomy: all
    tight = draw(st.integers(6, 12)) if paged else draw(st.integers(16, 40))
    num_blocks = draw(st.sampled_from([tight, tight, tight, 128]))
    num_cpu_blocks = draw(st.sampled_from([0, 8, 64])) if mode == "swap" else 0
    max_num_seqs = draw(st.sampled_from([2, 4, 8, 8]))
    watermark = draw(st.sampled_from([0.0, DEFAULT_WATERMARK]))
    return Case(system, mode, caching, chunked, num_blocks, num_cpu_blocks, max_num_seqs,
                watermark, draw(_requests(beams, caching)))  # fmt: skip


def _first_difference(engine: pd.DataFrame, sim: pd.DataFrame) -> str:
    """The first step where the frames part (both rows), or their lengths."""
    for i in range(min(len(engine), len(sim))):
        a, b = engine.iloc[i], sim.iloc[i]
        if not a.equals(b):
            both = pd.DataFrame({"engine": a, "simulator": b})
            return f"step {i} differs:\n{both[a.ne(b) & ~(a.isna() & b.isna())]}"
    return f"the engine made {len(engine)} steps, the simulator {len(sim)}"


def _engine_shares_more_blocks(reqs: Sequence[Request], outputs: dict[int, RequestOutput]) -> bool:
    """Whether two sequences' token streams (prompt and generated ids) in the engine agree on
    more leading full blocks than in the simulator, where generated ids are each sequence's
    own (``core.sched.base.stand_in_token_id``) and only the prompts can agree: then the
    engine's prefix cache may share blocks the simulator's cannot (a known limit). Beams of
    one request agree in both bodies as they share parents, and are not compared."""
    streams = [
        (r, [*r.prompt_token_ids, *tokens])
        for r in reqs
        if r.request_id in outputs
        for tokens in outputs[r.request_id].token_ids
    ]
    for i, (r, a) in enumerate(streams):
        for q, b in streams[i + 1 :]:
            if r is q and r.sampling.beam_width > 1:
                continue
            if _common(a, b) // BLOCK > _common(r.prompt_token_ids, q.prompt_token_ids) // BLOCK:
                return True
    return False


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix of ``a`` and ``b``."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def check_two_bodies(case: Case, skip_known_limit: bool = True) -> None:
    """Serve ``case`` with the engine on a virtual clock, replay its step times (and beam
    choices) in the simulator and require equal step and request frames. With
    ``skip_known_limit``, a prefix-caching run where the engine's tokens give two sequences
    block contents the simulator cannot know of is rejected (hypothesis ``assume``;
    :func:`_engine_shares_more_blocks`)."""
    print(case.describe())  # shown with hypothesis' falsifying example
    engine = LLMEngine(
        tiny_config(), system=case.system, num_blocks=case.num_blocks, block_size=BLOCK,
        sched_config=case.config(), num_cpu_blocks=case.num_cpu_blocks,
        enable_prefix_caching=case.caching, watermark=case.watermark, check_integrity_every=1,
    )  # fmt: skip
    init_dummy_weights(engine.model, 0, std=TEST_STD)
    reqs = list(case.reqs)
    result = engine.generate(reqs, mode="online", clock="virtual")
    eng = result.recorder
    if case.caching and skip_known_limit:
        assume(not _engine_shares_more_blocks(case.reqs, result.outputs))

    def make_scheduler() -> BaseScheduler:
        return build_scheduler(
            case.system, case.num_blocks * BLOCK, case.config(), block_size=BLOCK,
            num_cpu_slots=case.num_cpu_blocks * BLOCK, enable_prefix_caching=case.caching,
            watermark=case.watermark,
        )  # fmt: skip

    e_steps = eng.steps_frame()
    # past the recording (a diverged replay) the steps take 1 ms, so the frames can be told
    # apart at their first differing step
    cost = RecordedCostModel([*e_steps["duration_s"], *[1e-3] * SPARE_STEPS])
    beams = RecordedBeams(engine.beam_log.rows)
    sim = simulate(reqs, make_scheduler, cost, recorded_beams=beams,
                   check_integrity_every=1).recorder  # fmt: skip
    s_steps = sim.steps_frame()
    assert e_steps.equals(s_steps), _first_difference(e_steps, s_steps)
    assert cost.steps_left == SPARE_STEPS
    e_req, s_req = eng.requests_frame(), sim.requests_frame()
    assert e_req.equals(s_req), f"request frames differ:\n{e_req.compare(s_req)}"
    assert set(e_req["status"]) <= {"finished", "rejected"}


FUZZ = settings(
    max_examples=20, deadline=None, derandomize=True, database=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip
# the built-ins and the example plugin (not SYSTEMS: other test modules register systems of
# their own as they are imported, some broken on purpose). Loaded as system.plugin loads it,
# so it is known as the plugin's: a plain import would register vllm_spf as a system of no
# plugin, and the plugin tests that run later in this process would see no plugin's system
load_plugin("tests.policy_plugin")
SYSTEM_NAMES = [*sorted(BUILT_IN), "vllm_spf"]


@pytest.mark.parametrize("system", SYSTEM_NAMES)
@FUZZ
@given(data=st.data())
def test_the_simulator_replays_the_engine(system: str, data: st.DataObject) -> None:
    check_two_bodies(data.draw(cases([system]), label="case"))


@pytest.mark.parametrize("system", SYSTEM_NAMES)
@settings(FUZZ, max_examples=10)
@given(data=st.data())
def test_the_simulator_replays_the_engines_beams(system: str, data: st.DataObject) -> None:
    check_two_bodies(data.draw(cases([system], beams=True), label="case"))


def test_the_check_sees_greedy_requests_share_generated_blocks_in_the_engine_only() -> None:
    """The check is not vacuous: a known limit of the simulator makes the bodies part.
    Requests 0 and 2 hold one prompt and sample greedily, so they generate the same tokens;
    preempted by recompute (6 blocks, no CPU pool), the engine's prefix cache re-admits one
    sharing the other's generated blocks, the simulator (a stand-in id per sequence,
    ``stand_in_token_id``) cannot, and they part at step 4."""
    reqs = requests([(3, 8), (6, 6), (3, 8)])
    reqs[2] = dataclasses.replace(reqs[2], prompt_token_ids=reqs[0].prompt_token_ids)
    case = Case("vllm", "recompute", True, False, 6, 0, 8, DEFAULT_WATERMARK, tuple(reqs))
    with pytest.raises(AssertionError, match=r"step 4 differs"):
        check_two_bodies(case, skip_known_limit=False)
