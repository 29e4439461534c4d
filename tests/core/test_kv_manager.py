"""Two-tier KV manager: shadows, write-back, rotation, copy-on-write, quarantine, prefix
caching; plus a property-based test over random operation sequences."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from superinfer.core.kv.errors import KVInvariantError
from superinfer.core.kv.manager import TwoTierKVManager
from superinfer.core.kv.prefix import prefix_hashes
from superinfer.core.kv.transfer import Direction
from superinfer.core.request import RequestStatus
from tests.factories import make_request

BS = 4


def make_kv(num_device=16, num_host=32, writeback=True, caching=True) -> TwoTierKVManager:
    kv = TwoTierKVManager(num_device, num_host, BS, enable_prefix_caching=caching)
    kv.is_eager_writeback = writeback
    return kv


def admit(kv, request, num_tokens=None):
    num_tokens = request.num_tokens if num_tokens is None else num_tokens
    request.num_computed_tokens = kv.match_prefix(request)
    kv.allocate_slots(request, num_tokens - request.num_computed_tokens)
    request.status = RequestStatus.RUNNING


def compute_all(kv, request):
    request.num_computed_tokens = request.num_tokens
    kv.on_tokens_computed(request)


def finish_copies(kv):
    kv.complete_transfers([spec.transfer_id for spec in kv.take_planned_transfers()])


def test_writeback_makes_swap_out_copy_only_the_tail():
    kv = make_kv()
    request = make_request(num_prompt_tokens=10)  # blocks: 4 + 4 + 2 (tail)
    admit(kv, request)
    compute_all(kv, request)
    (writeback,) = kv.take_planned_transfers()
    assert writeback.direction is Direction.D2H and writeback.num_blocks == 2
    kv.complete_transfers([writeback.transfer_id])
    assert kv.num_swap_out_copies(request) == 1
    kv.swap_out(request)
    request.status = RequestStatus.SWAPPED
    (swap_out,) = kv.take_planned_transfers()
    assert swap_out.num_blocks == 1  # only the partial tail moved
    kv.check_invariants([request])
    assert kv.device.num_free_blocks == kv.device.num_blocks - 1  # tail quarantined
    kv.complete_transfers([swap_out.transfer_id])
    assert kv.device.num_free_blocks == kv.device.num_blocks


def test_swap_in_repairs_shadows_so_a_second_rotation_moves_only_the_tail():
    kv = make_kv()
    request = make_request(num_prompt_tokens=10)
    admit(kv, request)
    compute_all(kv, request)
    finish_copies(kv)
    kv.swap_out(request)
    request.status = RequestStatus.SWAPPED
    finish_copies(kv)
    host_full_blocks = kv.tables[request.request_id].host[:2]
    assert kv.can_swap_in(request, 1)
    spec = kv.swap_in(request)
    request.status = RequestStatus.RUNNING
    assert spec.direction is Direction.H2D and spec.num_blocks == 3
    device = kv.block_table(request)
    assert [kv.shadow_of.get(b) for b in device[:2]] == host_full_blocks
    assert device[2] not in kv.shadow_of  # the tail's host copy is released
    kv.complete_transfers([spec.transfer_id])
    kv.check_invariants([request])
    assert kv.num_swap_out_copies(request) == 1


def test_reused_device_block_gets_a_fresh_shadow():
    kv = make_kv(num_device=3, caching=False)
    a = make_request(num_prompt_tokens=8)  # two full blocks
    admit(kv, a)
    compute_all(kv, a)
    finish_copies(kv)
    a_shadows = [kv.shadow_of[b] for b in kv.block_table(a)]
    kv.swap_out(a)
    a.status = RequestStatus.SWAPPED
    finish_copies(kv)
    assert kv.tables[a.request_id].host == a_shadows
    b = make_request(num_prompt_tokens=8)
    admit(kv, b)  # reuses a's old device blocks
    compute_all(kv, b)
    finish_copies(kv)
    b_shadows = [kv.shadow_of[block] for block in kv.block_table(b)]
    assert not set(b_shadows) & set(a_shadows)
    kv.check_invariants([a, b])


def test_a_swap_out_drops_other_requests_shadows_when_the_host_is_full():
    """Shadows only cache live device blocks: a full host tier of them still takes a
    rotation (dropping another request's, never the victim's own), and they do not count
    as host memory in use."""
    kv = make_kv(num_device=8, num_host=3)
    a = make_request(num_prompt_tokens=8)  # two full blocks
    b = make_request(num_prompt_tokens=6)  # one full block and a tail
    for request in (a, b):
        admit(kv, request)
        compute_all(kv, request)
    finish_copies(kv)
    assert kv.host.num_free_blocks == 0 and kv.num_reclaimable_host_blocks() == 3
    assert kv.host_usage_pinned() == 0.0
    assert kv.host_usage_pinned(past_usage=1.0) == 1.0  # not scanned under a guard at 100%
    b_shadow = kv.shadow_of[kv.block_table(b)[0]]
    assert kv.can_swap_out(b)
    kv.swap_out(b)
    b.status = RequestStatus.SWAPPED
    assert kv.stats.num_reclaimed_shadows == 1
    assert kv.tables[b.request_id].host[0] == b_shadow  # its own shadow was kept
    assert len(kv.shadow_of) == 1  # one of a's two is left
    kv.check_invariants([a, b])
    assert kv.host_usage_pinned() == pytest.approx(2 / 3)  # b's two blocks
    assert not kv.can_swap_out(a)  # a's unshadowed block has nowhere to go
    finish_copies(kv)
    kv.free(a)
    kv.free(b)
    assert kv.host.num_free_blocks == 3 and kv.device.num_free_blocks == 8


def test_block_with_copy_in_flight_is_quarantined():
    kv = make_kv(num_device=3, writeback=False)
    request = make_request(num_prompt_tokens=12)
    admit(kv, request)
    compute_all(kv, request)
    kv.swap_out(request)
    request.status = RequestStatus.SWAPPED
    assert kv.device.num_free_blocks == 0  # all three still being read
    other = make_request(num_prompt_tokens=3)
    assert not kv.can_allocate(other, 3)
    assert not kv.can_swap_in(request, 1)  # its host copies are not complete yet
    finish_copies(kv)
    assert kv.can_allocate(other, 3)
    kv.check_invariants([request])


def test_finished_swapped_request_returns_its_host_blocks():
    kv = make_kv()
    request = make_request(num_prompt_tokens=10)
    admit(kv, request)
    compute_all(kv, request)
    kv.swap_out(request)
    request.status = RequestStatus.SWAPPED
    finish_copies(kv)
    assert kv.host.num_free_blocks < kv.host.num_blocks
    kv.free(request)
    request.status = RequestStatus.FINISHED_ABORTED
    kv.check_invariants([request])
    assert kv.host.num_free_blocks == kv.host.num_blocks


def test_prefix_cache_shares_full_computed_blocks_only():
    kv = make_kv(writeback=False)
    prompt = list(range(100, 111))  # 11 tokens: 2 full blocks + 3
    a = make_request(prompt_token_ids=prompt)
    admit(kv, a, num_tokens=6)  # computes 6 tokens: only block 0 full and computed
    a.num_computed_tokens = 6
    kv.on_tokens_computed(a)
    b = make_request(prompt_token_ids=prompt)
    assert kv.match_prefix(b) == 4
    assert kv.block_table(b)[0] == kv.block_table(a)[0]
    assert kv.device.ref_counts[kv.block_table(a)[0]] == 2
    b.num_computed_tokens = 4
    b.status = RequestStatus.RUNNING
    kv.check_invariants([a, b])


def test_prefix_hit_leaves_the_last_token_to_compute():
    kv = make_kv(writeback=False)
    prompt = list(range(100, 108))  # exactly 2 blocks
    a = make_request(prompt_token_ids=prompt)
    admit(kv, a)
    compute_all(kv, a)
    b = make_request(prompt_token_ids=prompt)
    assert kv.match_prefix(b) == 4  # not 8: the last token must run to give logits


@pytest.mark.parametrize("prompt", [list(range(100, 108)), list(range(100, 111)),
                                    list(range(100, 109)) + [7, 8, 9, 10, 11, 12]])  # fmt: skip
def test_the_read_only_probe_predicts_the_hit_before_it_is_taken(prompt):
    """Admission asks `num_cached_tokens` from another thread; `match_prefix` then hits
    exactly that much, and the probe changed no reference count."""
    kv = make_kv(writeback=False)
    a = make_request(prompt_token_ids=list(range(100, 111)))
    admit(kv, a)
    compute_all(kv, a)
    b = make_request(prompt_token_ids=prompt)
    counts = list(kv.device.ref_counts)
    probed = kv.num_cached_tokens(prompt)
    assert kv.device.ref_counts == counts
    assert probed == kv.match_prefix(b) > 0
    kv.free(a)
    kv.free(b)  # freed blocks keep their content: still a hit until reused
    c = make_request(prompt_token_ids=prompt)
    assert kv.num_cached_tokens(prompt) == kv.match_prefix(c) == probed
    assert make_kv(caching=False).num_cached_tokens(prompt) == 0


def test_the_probe_names_blocks_as_the_manager_does():
    kv = make_kv(writeback=False)
    a = make_request(prompt_token_ids=list(range(100, 111)))
    admit(kv, a)
    compute_all(kv, a)
    assert kv._table(a).block_hashes == list(prefix_hashes(list(range(100, 111)), BS))


def test_double_free_is_caught():
    kv = make_kv()
    with pytest.raises(KVInvariantError):
        kv.device.free([0])


class KVMachine(RuleBasedStateMachine):
    """Random allocate / append / swap-out / swap-in / free / abort / copy completion."""

    def __init__(self) -> None:
        super().__init__()
        self.kv = make_kv(num_device=12, num_host=20)
        self.requests = []
        self.inflight: list[int] = []
        self.num_made = 0  # prompts from this count, not a global one: replays draw alike

    def _with(self, status):
        return [r for r in self.requests if r.status is status]

    @rule(num_prompt=st.integers(1, 20), shared_prefix=st.booleans())
    def allocate(self, num_prompt, shared_prefix):
        self.num_made += 1
        start = 7 if shared_prefix else 1000 * self.num_made  # unique unless shared
        request = make_request(prompt_token_ids=list(range(start, start + num_prompt)))
        request.num_computed_tokens = self.kv.match_prefix(request)
        if self.kv.can_allocate(request, request.num_uncomputed_tokens):
            self.kv.allocate_slots(request, request.num_uncomputed_tokens)
            request.status = RequestStatus.RUNNING
            self.requests.append(request)
        else:
            self.kv.free(request)

    @precondition(lambda self: self._with(RequestStatus.RUNNING))
    @rule(data=st.data())
    def append(self, data):
        request = data.draw(st.sampled_from(self._with(RequestStatus.RUNNING)))
        request.num_computed_tokens = request.num_tokens  # the forward computed them
        self.kv.on_tokens_computed(request)
        request.output_token_ids.append(5)
        if self.kv.can_allocate(request, 1):
            self.kv.allocate_slots(request, 1)
        else:
            self._release(request, RequestStatus.FINISHED_LENGTH)

    @precondition(lambda self: self._with(RequestStatus.RUNNING))
    @rule(data=st.data())
    def swap_out(self, data):
        request = data.draw(st.sampled_from(self._with(RequestStatus.RUNNING)))
        if self.kv.can_swap_out(request):
            self.kv.swap_out(request)
            request.status = RequestStatus.SWAPPED

    @precondition(lambda self: self._with(RequestStatus.SWAPPED))
    @rule(data=st.data())
    def swap_in(self, data):
        request = data.draw(st.sampled_from(self._with(RequestStatus.SWAPPED)))
        if self.kv.can_swap_in(request, request.num_uncomputed_tokens):
            self.kv.swap_in(request)
            self.kv.allocate_slots(request, request.num_uncomputed_tokens)
            request.status = RequestStatus.RUNNING

    @precondition(lambda self: self.requests)
    @rule(data=st.data(), is_abort=st.booleans())
    def free(self, data, is_abort):
        request = data.draw(st.sampled_from(self.requests))
        status = RequestStatus.FINISHED_ABORTED if is_abort else RequestStatus.FINISHED_STOPPED
        self._release(request, status)

    @rule(num_done=st.integers(0, 3))
    def complete_copies(self, num_done):
        self.inflight += [s.transfer_id for s in self.kv.take_planned_transfers()]
        done, self.inflight = self.inflight[:num_done], self.inflight[num_done:]
        self.kv.complete_transfers(done)

    def _release(self, request, status):
        self.kv.free(request)
        request.status = status
        self.requests.remove(request)

    @invariant()
    def invariants_hold(self):
        self.kv.check_invariants(self.requests)

    def teardown(self):
        for request in list(self.requests):
            self._release(request, RequestStatus.FINISHED_ABORTED)
        self.complete_copies(10**6)
        self.kv.check_invariants()
        assert self.kv.device.num_free_blocks == self.kv.device.num_blocks
        assert self.kv.host.num_free_blocks == self.kv.host.num_blocks
        assert not self.kv.shadow_of


class SmallHostKVMachine(KVMachine):
    """The same, with a host tier smaller than the device pool: rotations drop shadows."""

    def __init__(self) -> None:
        super().__init__()
        self.kv = make_kv(num_device=12, num_host=5)


SETTINGS = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    derandomize=True,  # the same sequences on every run: CI never flakes on a new example
    suppress_health_check=[HealthCheck.too_slow],  # the machine is shared and noisy
)
TestKVMachine = KVMachine.TestCase
TestKVMachine.settings = SETTINGS
TestSmallHostKVMachine = SmallHostKVMachine.TestCase
TestSmallHostKVMachine.settings = SETTINGS


def test_blocks_freed_while_a_forward_runs_wait_for_it():
    kv = make_kv(writeback=False)
    request = make_request(num_prompt_tokens=10)
    admit(kv, request)
    num_free = kv.device.num_free_blocks
    kv.begin_step_fence()
    kv.free(request)
    request.status = RequestStatus.FINISHED_ABORTED
    kv.check_invariants([request])
    assert kv.device.num_free_blocks == num_free  # still quarantined
    kv.end_step_fence()
    assert kv.device.num_free_blocks == kv.device.num_blocks
