"""Provisional tokens (omni/core/provisional.py): the scheduler's side of a step launched before
the previous step's ids are read. Torch-free."""

from omni.core.block_hash import hash_request_blocks
from omni.core.kv_cache_manager import KVCacheManager
from omni.core.provisional import PLACEHOLDER, PLACEHOLDER_CODES, advance, resolve
from omni.core.request import Request, RequestStatus
from omni.core.sampling_params import SamplingParams
from omni.core.scheduler import Scheduler, SchedulerConfig
from omni.core.scheduler_output import RunnerOutput


def scheduler_with(*requests: Request) -> Scheduler:
    scheduler = Scheduler(SchedulerConfig(4, 64, 64), KVCacheManager(32, 4))
    for request in requests:
        scheduler.add_request(request)
    return scheduler


def request(request_id: str, num_prompt: int = 7, **params) -> Request:
    prompt = [10 + i for i in range(num_prompt)]
    return Request(request_id, prompt, sampling_params=SamplingParams(**params))


def test_placeholders_are_never_hashed_or_cached():
    req = request("a", max_tokens=10, ignore_eos=True)
    scheduler = scheduler_with(req)
    first = scheduler.schedule()
    pending = advance(scheduler, first)  # prefill of 7 launched; its token is on the device
    assert req.output_token_ids == [PLACEHOLDER] and req.num_provisional == 1
    assert req.num_tokens == 8 and req.num_computed_tokens == 7
    # Block 1 (positions 4..7) would be full with the placeholder: neither hashed nor cached.
    assert len(hash_request_blocks(req, 4, "xxhash")) == 1
    second = scheduler.schedule()  # launched ahead: feeds the placeholder
    assert [e.token_ids for e in second.scheduled] == [[PLACEHOLDER]]
    assert len(scheduler.kv.cached_block_ids()) == 1
    pending_2 = advance(scheduler, second)
    appended: list[Request] = []
    assert not resolve(scheduler, pending, RunnerOutput({"a": 5}), appended)
    assert appended == [req] and req.output_token_ids == [5, PLACEHOLDER]
    assert req.all_token_ids[7:] == [5, PLACEHOLDER] and req.num_provisional == 1
    assert not resolve(scheduler, pending_2, RunnerOutput({"a": 6}), [])
    assert req.output_token_ids == [5, 6] and req.num_provisional == 0
    scheduler.schedule()  # now block 1 holds known tokens only: cached
    assert len(scheduler.kv.cached_block_ids()) == 2


def test_a_stop_in_flight_drops_the_placeholders_after_it():
    req, other = request("a", stop_token_ids=[99]), request("b", num_prompt=5, max_tokens=10)
    scheduler = scheduler_with(req, other)
    pending = advance(scheduler, scheduler.schedule())
    pending_2 = advance(scheduler, scheduler.schedule())  # both fed their placeholders
    finished = resolve(scheduler, pending, RunnerOutput({"a": 99, "b": 7}), [])
    assert finished == [req] and req.status is RequestStatus.FINISHED_STOPPED
    assert req.output_token_ids == [99] and req.num_tokens == 8 and req.num_provisional == 0
    assert scheduler.running == [other] and other.output_token_ids == [7, PLACEHOLDER]
    scheduler.release(req)
    appended: list[Request] = []
    assert not resolve(scheduler, pending_2, RunnerOutput({"a": 1, "b": 8}), appended)
    assert appended == [other] and other.output_token_ids == [7, 8]  # a's row: dropped


def test_length_stop_counts_the_tokens_own_position():
    req = request("a", max_tokens=2, ignore_eos=True)
    scheduler = scheduler_with(req)
    pending = advance(scheduler, scheduler.schedule())
    pending_2 = advance(scheduler, scheduler.schedule())
    assert not resolve(scheduler, pending, RunnerOutput({"a": 3}), [])  # token 1 of 2
    assert resolve(scheduler, pending_2, RunnerOutput({"a": 4}), []) == [req]
    assert req.status is RequestStatus.FINISHED_LENGTH and req.output_token_ids == [3, 4]


def test_advance_then_resolve_is_update_from_output():
    """Twin schedulers, one updated synchronously: the same tokens, counts and finishes."""
    sync = scheduler_with(request("a", max_tokens=3), request("b", num_prompt=9, max_tokens=5))
    piped = scheduler_with(request("a", max_tokens=3), request("b", num_prompt=9, max_tokens=5))
    for step in range(6):
        out_sync, out_piped = sync.schedule(), piped.schedule()
        assert out_sync == out_piped
        tokens = RunnerOutput({e.request_id: 20 + step for e in out_sync.scheduled if e.sample})
        done_sync = sync.update_from_output(out_sync, tokens)
        done_piped = resolve(piped, advance(piped, out_piped), tokens, [])
        assert [r.request_id for r in done_sync] == [r.request_id for r in done_piped]
        for r in done_sync:
            sync.release(r)
        for r in done_piped:
            piped.release(r)
        for request_id, r in sync.requests.items():
            twin = piped.requests[request_id]
            assert r.all_token_ids == twin.all_token_ids
            assert r.num_computed_tokens == twin.num_computed_tokens
    assert not sync.has_unfinished and not piped.has_unfinished


def test_a_multi_code_stages_codes_follow_its_tokens():
    """A multi-code step launched ahead: each placeholder token has placeholder residual codes,
    which the scheduler hands on as the fed codes; resolve writes the real ones over them, the
    last known token's codes are the newest read, and a stop drops the codes after it too."""
    req, other = request("a", stop_token_ids=[99]), request("b", num_prompt=5, max_tokens=10)
    scheduler = scheduler_with(req, other)
    pending = advance(scheduler, scheduler.schedule(), with_codes=True)
    assert req.output_codes == [PLACEHOLDER_CODES] and req.num_provisional == 1
    ahead = scheduler.schedule()  # feeds the placeholders: token and codes
    assert [e.fed_codes for e in ahead.scheduled] == [(PLACEHOLDER_CODES,)] * 2
    pending_2 = advance(scheduler, ahead, with_codes=True)
    output = RunnerOutput({"a": 5, "b": 7}, sampled_codes={"a": (1, 2), "b": (3, 4)})
    assert not resolve(scheduler, pending, output, [])
    assert req.output_codes == [(1, 2), PLACEHOLDER_CODES] and req.last_known_codes == (1, 2)
    stop = RunnerOutput({"a": 99, "b": 8}, sampled_codes={"a": (5, 6), "b": (7, 8)})
    assert resolve(scheduler, pending_2, stop, []) == [req]
    assert req.output_codes == [(1, 2), (5, 6)] and other.output_codes == [(3, 4), (7, 8)]
    assert other.last_known_codes == (7, 8)
