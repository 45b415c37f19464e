"""The scheduler alone (torch-free), driven by a fake runner that samples fixed tokens."""

from omni.core import KVCacheManager, Request, RequestStatus, SamplingParams
from omni.core.scheduler import Scheduler, SchedulerConfig
from omni.core.scheduler_output import RunnerOutput


def make(num_blocks=64, block_size=4, **config):
    kv = KVCacheManager(num_blocks, block_size)
    return Scheduler(SchedulerConfig(**config), kv), kv


def fake_step(scheduler, token=7):
    out = scheduler.schedule()
    sampled = {e.request_id: token for e in out.scheduled if e.sample}
    finished = scheduler.update_from_output(out, RunnerOutput(sampled))
    for request in finished:
        scheduler.release(request)
    return out, finished


def test_chunked_prefill_respects_the_budget():
    scheduler, _ = make(max_num_batched_tokens=10)
    scheduler.add_request(
        Request("a", list(range(25)), sampling_params=SamplingParams(max_tokens=2))
    )
    chunks = []
    while scheduler.has_unfinished:
        out, _ = fake_step(scheduler)
        chunks.append([(e.num_computed_tokens, len(e.token_ids), e.sample) for e in out.scheduled])
    assert chunks == [[(0, 10, False)], [(10, 10, False)], [(20, 5, True)], [(25, 1, True)]]


def test_budget_shared_between_decode_and_new_prefill():
    scheduler, _ = make(max_num_batched_tokens=8)
    scheduler.add_request(Request("a", [1, 2, 3], sampling_params=SamplingParams(max_tokens=5)))
    fake_step(scheduler)
    scheduler.add_request(
        Request("b", list(range(20)), sampling_params=SamplingParams(max_tokens=1))
    )
    out, _ = fake_step(scheduler)
    assert [(e.request_id, len(e.token_ids)) for e in out.scheduled] == [("a", 1), ("b", 7)]


def test_max_num_seqs():
    scheduler, _ = make(max_num_seqs=2)
    for name in "abc":
        scheduler.add_request(
            Request(name, [1, 2, 3], sampling_params=SamplingParams(max_tokens=3))
        )
    out, _ = fake_step(scheduler)
    assert [e.request_id for e in out.scheduled] == ["a", "b"]


def test_stop_conditions():
    scheduler, _ = make(max_model_len=6)
    scheduler.add_request(
        Request("eos", [1], sampling_params=SamplingParams(max_tokens=9), eos_token_id=7)
    )
    scheduler.add_request(
        Request(
            "ign",
            [1],
            sampling_params=SamplingParams(max_tokens=2, ignore_eos=True),
            eos_token_id=7,
        )
    )
    scheduler.add_request(
        Request("stop", [1], sampling_params=SamplingParams(max_tokens=9, stop_token_ids=(7,)))
    )
    scheduler.add_request(Request("len", [1, 2, 3], sampling_params=SamplingParams(max_tokens=9)))
    finished = {}
    while scheduler.has_unfinished:
        for request in fake_step(scheduler)[1]:
            finished[request.request_id] = request
    assert finished["eos"].status == RequestStatus.FINISHED_STOPPED and finished[
        "eos"
    ].output_token_ids == [7]
    assert finished["ign"].status == RequestStatus.FINISHED_LENGTH and finished[
        "ign"
    ].output_token_ids == [7, 7]
    assert finished["stop"].status == RequestStatus.FINISHED_STOPPED
    assert (
        finished["len"].status == RequestStatus.FINISHED_LENGTH and finished["len"].num_tokens == 6
    )


def test_preemption_frees_the_newest_and_resumes_from_the_cache():
    # 6 blocks of 2: a (4 tokens) and b (4 tokens) take 2 blocks each and grow one block per
    # two decode steps until the pool is exhausted; the newer request b is preempted.
    scheduler, kv = make(num_blocks=6, block_size=2)
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    scheduler.add_request(Request("a", [1, 2, 3, 4], sampling_params=params))
    scheduler.add_request(Request("b", [5, 6, 7, 8], sampling_params=params))
    preempted_seen = resumed_with_hits = False
    while scheduler.has_unfinished:
        out, _ = fake_step(scheduler)
        if "b" in out.preempted_request_ids:
            preempted_seen = True
            # A step that preempted admits nobody: the victim does not bounce straight back.
            assert not any(entry.is_new for entry in out.scheduled)
        for entry in out.scheduled:
            if entry.request_id == "b" and entry.is_new and entry.num_computed_tokens > 0:
                resumed_with_hits = True
    assert preempted_seen and scheduler.num_preemptions >= 1
    assert resumed_with_hits
    # Resumptions are not new prefix-cache queries.
    assert kv.stats.requests == 2
    assert kv.num_free_blocks == 6


def test_abort_frees_blocks_between_steps():
    scheduler, kv = make(num_blocks=8)
    scheduler.add_request(
        Request("a", list(range(9)), sampling_params=SamplingParams(max_tokens=5))
    )
    scheduler.add_request(
        Request("w", list(range(9)), sampling_params=SamplingParams(max_tokens=5))
    )
    fake_step(scheduler)
    aborted = scheduler.finish_requests(["a", "w", "missing"], RequestStatus.FINISHED_ABORTED)
    assert [r.request_id for r in aborted] == ["a", "w"]
    assert kv.num_free_blocks == 8 and not scheduler.has_unfinished


def test_hit_filter_refuses_and_counts():
    scheduler, kv = make(num_blocks=16, block_size=4)
    scheduler.hit_filter = lambda hit_ids, pending: 1
    scheduler.add_request(
        Request("a", list(range(13)), sampling_params=SamplingParams(max_tokens=1))
    )
    fake_step(scheduler)
    scheduler.add_request(
        Request("b", list(range(13)), sampling_params=SamplingParams(max_tokens=1))
    )
    out, _ = fake_step(scheduler)
    assert out.scheduled[0].num_computed_tokens == 4
    assert scheduler.num_hit_blocks_refused == 2


def test_input_limit_skips_a_waiting_request_without_holding_others():
    """A streaming request feeds nothing past the inputs that have come; the others go on, and
    once every running request waits, the scheduler says there is nothing to do."""
    scheduler, _ = make(max_num_batched_tokens=64)
    streamed = Request("s", [1, 2, 3], sampling_params=SamplingParams(max_tokens=9))
    streamed.input_limit = 4  # the prompt and the first generated position have their inputs
    scheduler.add_request(streamed)
    scheduler.add_request(Request("a", [4, 5], sampling_params=SamplingParams(max_tokens=9)))
    fed = []
    for _ in range(4):
        out, _ = fake_step(scheduler)
        fed.append({e.request_id: len(e.token_ids) for e in out.scheduled})
    assert fed == [{"s": 3, "a": 2}, {"s": 1, "a": 1}, {"a": 1}, {"a": 1}]
    assert streamed.num_computed_tokens == 4 and streamed.num_output_tokens == 2
    assert scheduler.has_ready_work  # "a" still runs
    scheduler.finish_requests(["a"], RequestStatus.FINISHED_ABORTED)
    assert scheduler.has_unfinished and not scheduler.has_ready_work
    streamed.input_limit = None  # its upstream finished: every position can be fed
    out, _ = fake_step(scheduler)
    assert [(e.request_id, len(e.token_ids), e.sample) for e in out.scheduled] == [("s", 1, True)]


def test_input_limit_caps_a_resumed_request_and_its_prefix_hits():
    """After preemption a streaming request recomputes only up to its input limit, with prefix
    hits cut to blocks inside it, and samples nothing until it reaches its last token."""
    scheduler, kv = make(num_blocks=64, block_size=4, max_num_batched_tokens=64)
    request = Request("s", list(range(10)), sampling_params=SamplingParams(max_tokens=9))
    scheduler.add_request(request)
    fake_step(scheduler)  # prefill, samples one token: 11 tokens, 10 computed
    request.input_limit = 7
    scheduler.running.remove(request)
    scheduler._preempt(request)  # as schedule() does when the pool runs out
    out, _ = fake_step(scheduler)
    assert out.scheduled == [] and out.preempted_request_ids == ["s"]  # reported, not re-admitted
    out, _ = fake_step(scheduler)
    (entry,) = out.scheduled
    assert entry.num_computed_tokens + len(entry.token_ids) == 7  # hits (4) + recompute to 7
    assert entry.num_computed_tokens == 4 and not entry.sample
    assert kv.get_block_ids("s")
