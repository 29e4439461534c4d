"""The asyncio driver: one engine thread runs `LLMEngine.step()`; callers on an event loop
add requests, read their outputs from per-request queues, and abort them.

    event loop                         engine thread
    add_request / abort / call  ---->  commands, applied between steps
    RequestStream (asyncio.Queue) <--  outputs of each step, one call_soon_threadsafe

Several sequences of one prompt (`n`, `best_of`) share its KV: `share_prompt(leader,
followers)` before adding them holds the followers back on the loop until the leader's
first output, so its prompt blocks are computed and in the prefix cache when they are
scheduled, and each follower prefills only the last, partial block (no duplicate prefill).
Each sequence is still a request of its own: its own stream, SLO record and abort.

The engine is single-threaded inside: only the engine thread touches it, and the engine
thread also builds it. So every torch op of the engine runs on one thread, and on a CPU
one OpenMP thread team does all the work. A second team (say, from loading the weights on
another thread) would make the process own more OpenMP threads than cores, and libgomp
then stops spin-waiting between parallel regions: measured on 2 cores, a decode step took
34 ms instead of 25. Independent of any web framework (the HTTP server and the Ray Serve
deployment both drive it).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from superinfer.core.step_time import BatchShape
from superinfer.engine.llm_engine import LLMEngine
from superinfer.engine.native_memory import release_free_memory
from superinfer.engine.snapshot import EngineSnapshot, StepRecord, expected_outputs
from superinfer.outputs import CompletionOutput, RequestMetrics, RequestOutput
from superinfer.sampling_params import SamplingParams
from superinfer.slo import SLOTargets
from superinfer.slo.estimate import (
    DrainRate,
    PrefillCost,
    Queued,
    ReleaseRate,
    num_pinned_host_blocks,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")
_EMA_WEIGHT = 0.2  # weight of the newest step in the step-time average
_IDLE_WAIT_S = 0.5
_SPIN_SLEEP_S = 0.001  # after an empty step (e.g. waiting for a KV copy to land)
_RELEASE_WINDOW_S = 20.0  # device blocks released per second: measured over this window
# return free heap pages to the OS this often under load, and whenever the engine goes idle
TRIM_EVERY_NUM_STEPS = 500


class EngineDeadError(RuntimeError):
    """The engine thread stopped; no request can be served."""


@dataclass
class _Add:
    request_id: str
    prompt: Mapping[str, Any]
    params: SamplingParams
    arrival_time: float
    priority: int
    slo: SLOTargets
    num_prompt_tokens: int


class RequestStream:
    """The outputs of one request, in order; iteration ends after the final one."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self.final: RequestOutput | None = None
        self.error: BaseException | None = None

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.final is not None or self.error is not None:
            raise StopAsyncIteration
        item = await self.queue.get()
        if isinstance(item, BaseException):
            self.error = item
            raise item
        if item.finished:
            self.final = item
        return item


DoneCallback = Callable[[str, "RequestOutput | None", "BaseException | None"], None]


class AsyncEngine:
    """Drive an `LLMEngine` from an asyncio event loop.

    `on_done(request_id, final_output, error)` runs on the loop exactly once for every
    request `add_request` accepted: with its final output (finished or aborted), or with
    the error that kept the engine from running it.
    """

    def __init__(
        self, engine_factory: Callable[[], LLMEngine], on_done: DoneCallback | None = None
    ) -> None:
        self._engine_factory = engine_factory
        self._engine: LLMEngine | None = None
        self.on_done = on_done
        self.snapshot = EngineSnapshot()
        # prefill's cost in served steps, learned from them; the warm-up sets its prior
        # (`learn_prefill_cost`) before any request is served
        self._prefill_cost = PrefillCost()
        self._streams: dict[str, RequestStream] = {}  # loop side
        # loop side: leader -> followers' adds held until its first output; follower -> leader
        self._held: dict[str, list[_Add]] = {}
        self._leader_of: dict[str, str] = {}
        self._active: set[str] = set()  # engine-thread side: added, not final
        self._commands: deque[Callable[[], None]] = deque()
        # adds not yet in a published snapshot: request id -> its place in the queue. An
        # add leaves it with the first snapshot built after the scheduler took it in, not
        # before: a request added at the start of a long step is not in the snapshot
        # admission reads until that step ends, and must not be invisible meanwhile
        self._pending: dict[str, Queued] = {}
        self._added: list[str] = []  # engine thread: added since the last publish
        # device blocks released per second by ended requests, over recent publishes
        self._release_rate = ReleaseRate(_RELEASE_WINDOW_S)
        self._host_drain = DrainRate(_RELEASE_WINDOW_S)  # and pinned host blocks drained
        self._finish_rate = ReleaseRate(_RELEASE_WINDOW_S)  # and seats freed by finishing
        self._cond = threading.Condition()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._is_stopping = False
        self._num_steps_untrimmed = 0
        self._num_prompt_tokens = self._num_generation_tokens = 0
        self._last_step: StepRecord | None = None  # from the engine's step observer
        self._step_started: float | None = None  # engine clock, while a step runs
        self.dead_error: BaseException | None = None

    # --- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the engine thread and build the engine on it; returns once it is built (or
        raises what building it raised). Call from the loop that will read the outputs."""
        self._loop = asyncio.get_running_loop()
        built: Future[None] = Future()
        self._thread = threading.Thread(
            target=self._run, args=(built,), name="superinfer-engine", daemon=True
        )
        self._thread.start()
        await asyncio.wrap_future(built)

    @property
    def engine(self) -> LLMEngine:
        """The engine; touch it only from the engine thread (see `call`)."""
        if self._engine is None:
            raise RuntimeError("the engine is not built yet: await start() first")
        return self._engine

    async def shutdown(self) -> None:
        """Abort what is left, stop the engine thread and close the engine."""
        for request_id in list(self._streams):
            self.abort(request_id)
        with self._cond:
            self._is_stopping = True
            self._cond.notify()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
        if self._engine is not None:
            self._engine.close()

    @property
    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.dead_error is None

    @property
    def num_unfinished(self) -> int:
        return len(self._streams)

    # --- requests -------------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        arrival_time: float,
        priority: int = 0,
        slo: SLOTargets | None = None,
        prompt: str | None = None,
    ) -> RequestStream:
        """Queue a tokenized request; `arrival_time` is on the engine's clock."""
        if not self.is_alive:
            raise EngineDeadError("the engine is not running") from self.dead_error
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is already in use")
        stream = RequestStream(request_id)
        self._streams[request_id] = stream
        add = _Add(
            request_id, {"prompt_token_ids": prompt_token_ids, "prompt": prompt}, params,
            arrival_time, priority, slo or SLOTargets(), len(prompt_token_ids),
        )  # fmt: skip
        leader = self._leader_of.get(request_id)
        with self._cond:
            deadline = arrival_time + add.slo.ttft_s
            num_outputs = expected_outputs(params.max_tokens, add.num_prompt_tokens, 0,
                                           self._max_model_len())  # fmt: skip
            self._pending[request_id] = Queued(
                deadline, add.num_prompt_tokens, add.slo.slo_class,
                add.num_prompt_tokens + num_outputs, add.slo.tbt_s,
            )  # fmt: skip
            if leader is not None and leader in self._held:
                self._held[leader].append(add)
                return stream
            self._leader_of.pop(request_id, None)
            self._commands.append(lambda: self._apply_add(add))
            self._cond.notify()
        return stream

    def share_prompt(self, leader_id: str, follower_ids: list[str]) -> None:
        """The followers (added after this) wait for the leader's first output, then reuse
        its prompt's KV blocks through the prefix cache. Call before adding any of them;
        `release_prompt(leader_id)` if the leader is never added."""
        self._held[leader_id] = []
        for follower_id in follower_ids:
            self._leader_of[follower_id] = leader_id

    def release_prompt(self, leader_id: str) -> None:
        """Add the followers held for `leader_id` now (its prompt is computed, or it ended)."""
        adds = self._held.pop(leader_id, None)
        if not adds:
            return
        if not self.is_alive:
            error = EngineDeadError("the engine is not running")
            for add in adds:
                self._leader_of.pop(add.request_id, None)
            self._on_loop([(add.request_id, error) for add in adds])
            return
        with self._cond:
            for add in adds:
                self._leader_of.pop(add.request_id, None)
                self._commands.append(lambda add=add: self._apply_add(add))
            self._cond.notify()

    def abort(self, request_id: str) -> None:
        """Abort a request (no-op once it finished); it ends with finish_reason "abort"."""
        leader = self._leader_of.get(request_id)
        held = self._held.get(leader, []) if leader is not None else []
        add = next((a for a in held if a.request_id == request_id), None)
        if add is not None:  # held back, never in the engine: it ends here
            held.remove(add)
            del self._leader_of[request_id]
            with self._cond:
                self._pending.pop(request_id, None)
            self._on_loop([(request_id, _never_ran(add))])
            return
        self._submit(lambda: self._apply_abort(request_id))

    async def call(self, fn: Callable[[LLMEngine], T]) -> T:
        """Run `fn(engine)` on the engine thread between two steps; returns its result."""
        future: Future[T] = Future()

        def run() -> None:
            try:
                future.set_result(fn(self.engine))
            except BaseException as error:
                future.set_exception(error)

        self._submit(run)
        return await asyncio.wrap_future(future)

    def _max_model_len(self) -> int:
        engine = self._engine
        return engine.config.scheduler.max_model_len if engine is not None else 1 << 30

    def queued(self) -> tuple[Queued, ...]:
        """The requests waiting to be admitted: the snapshot's, and those handed over that
        no published snapshot includes yet (added to the scheduler or not)."""
        with self._cond:
            return (*self.snapshot.waiting, *self._pending.values())

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no request is unfinished; False if `timeout_s` passed first."""
        deadline = time.monotonic() + timeout_s
        while self._streams and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return not self._streams

    def _submit(self, command: Callable[[], None]) -> None:
        with self._cond:
            self._commands.append(command)
            self._cond.notify()

    # --- engine thread --------------------------------------------------------------------
    def _run(self, built: Future[None]) -> None:
        try:
            self._engine = self._engine_factory()
        except BaseException as error:
            built.set_exception(error)
            return
        self._engine.add_step_observer(self._on_step)
        self._publish(0.0, 0.0)  # the pool sizes, before any step
        built.set_result(None)
        try:
            while self._next_round():
                pass
        except BaseException as error:  # the thread must report, never vanish silently
            logger.exception("engine thread died")
            self.dead_error = error
            self._fail_all(error)

    def _next_round(self) -> bool:
        with self._cond:
            if self._is_stopping:
                return False
            if not self._commands and not self.engine.has_work():
                self._cond.wait(_IDLE_WAIT_S)
            commands, self._commands = self._commands, deque()
        for command in commands:
            command()
        if self.engine.has_work():
            self._step()
            self._num_steps_untrimmed += 1
            if self._num_steps_untrimmed >= TRIM_EVERY_NUM_STEPS:
                self._trim()
        else:
            if self._num_steps_untrimmed:  # just went idle
                self._trim()
            self._publish(self.snapshot.step_time_s, self.snapshot.decode_step_s)
        return True

    def _trim(self) -> None:
        release_free_memory()
        self._num_steps_untrimmed = 0

    def _on_step(self, record: StepRecord) -> None:
        """The engine's step observer: the step-time metric reads its wall time."""
        self._last_step = record

    def num_cached_tokens(self, token_ids: list[int]) -> int:
        """Tokens of a prompt the device's prefix cache holds now, which its prefill will
        not compute (admission's estimate; read from the event loop while steps run)."""
        return self.engine.num_cached_tokens(token_ids)

    def step_left_s(self) -> float:
        """Seconds until the step now running ends (0 between steps), which admission counts
        before a newcomer's first token: what its forward's shape costs at the learned rates
        (`PrefillCost.step_s`: its decodes' step, its prompt tokens and pairs), less what it
        has run; the mean step's rest while no forward runs in it. A prefill step can take
        ten mean steps: the mean alone left a request arriving early in one hundreds of
        milliseconds short (docs/results/slo_promise/step_left_1206/)."""
        started = self._step_started
        if started is None:
            return 0.0
        elapsed_s = max(0.0, self.engine.clock() - started)
        shape, snapshot = self.engine.forward_in_flight(), self.snapshot
        if shape is None:
            return max(0.0, snapshot.step_time_s - elapsed_s)
        return max(0.0, self._prefill_cost.step_s(shape, snapshot.decode_step_s) - elapsed_s)

    def _step(self) -> None:
        self._last_step = None
        self._step_started = self.engine.clock()
        try:
            outputs = self.engine.step()
        except Exception as error:
            logger.exception("engine step failed; aborting the requests in it")
            self._abort_all(error)
            return
        record = self._last_step
        elapsed = record.wall_s if record is not None else 0.0
        step_time, decode_step = self.snapshot.step_time_s, self.snapshot.decode_step_s
        if outputs:
            step_time = _average(step_time, elapsed)
            forward = record.forward if record is not None else None
            if forward is not None and forward.num_prefill_tokens == 0:
                decode_step = _average(decode_step, elapsed)
            elif forward is not None:
                self._prefill_cost.observe_step(BatchShape.of(forward.batch), elapsed, decode_step)
        elif elapsed < _SPIN_SLEEP_S:
            time.sleep(_SPIN_SLEEP_S)
        self._count_tokens(outputs)
        self._publish(step_time, decode_step)
        self._step_started = None
        finals = [o.request_id for o in outputs if o.finished]
        self._active.difference_update(finals)
        if outputs:
            self._deliver([(o.request_id, o) for o in outputs])

    def learn_prefill_cost(
        self, prior_s_per_token: float, seeds: Sequence[tuple[int, float, float]] = ()
    ) -> None:
        """Start learning prefill's cost from served steps, from the warm-up's measures
        (`PrefillCost`'s prior and seeds; call before serving: the engine thread reads it at
        every step)."""
        self._prefill_cost = PrefillCost(prior_s_per_token, seeds=seeds)

    def _count_tokens(self, outputs: list[RequestOutput]) -> None:
        """Tokens generated, and the prompt tokens computed for each first token."""
        for output in outputs:
            num_new = len(output.new_token_ids)
            self._num_generation_tokens += num_new
            if num_new and num_new == len(output.outputs[0].token_ids):  # its first output
                num_cached = output.metrics.num_cached_prompt_tokens
                self._num_prompt_tokens += len(output.prompt_token_ids) - num_cached

    def _apply_add(self, add: _Add) -> None:
        try:
            self.engine.add_request(
                add.prompt, add.params, add.request_id, add.arrival_time, add.priority, add.slo
            )
        except Exception as error:
            with self._cond:
                self._pending.pop(add.request_id, None)
            self._deliver([(add.request_id, error)])
            return
        self._added.append(add.request_id)
        self._active.add(add.request_id)

    def _apply_abort(self, request_id: str, error: BaseException | None = None) -> None:
        """Abort in the engine (its blocks are freed in both tiers); the stream ends with
        an aborted output, or with `error` when the engine failed it."""
        if request_id not in self._active:
            return  # finished already, or its add failed
        self._active.discard(request_id)
        final = self.engine.abort(request_id)
        if error is not None:
            self._deliver([(request_id, error)])
        elif final is not None:
            self._deliver([(request_id, final)])

    def _abort_all(self, error: BaseException) -> None:
        for request_id in list(self._active):
            try:
                self._apply_abort(request_id, error)
            except Exception:
                logger.exception("abort of %s failed", request_id)
                self._active.discard(request_id)
                self._deliver([(request_id, error)])

    def _fail_all(self, error: BaseException) -> None:
        self._deliver([(request_id, error) for request_id in self._active])
        self._active.clear()

    def _publish(self, step_time_s: float, decode_step_s: float) -> None:
        snapshot = self.engine.snapshot()
        snapshot = replace(
            snapshot, step_time_s=step_time_s, decode_step_s=decode_step_s,
            prefill_s_per_token=self._prefill_cost.per_token_s,
            prefill_s_per_pair=self._prefill_cost.per_pair_s,
            num_prompt_tokens=self._num_prompt_tokens,
            num_generation_tokens=self._num_generation_tokens,
            release_blocks_per_s=self._release_rate.update(
                self.engine.clock(), snapshot.num_released_blocks),
            finished_per_s=self._finish_rate.update(self.engine.clock(), snapshot.num_finished),
            host_drain_blocks_per_s=self._host_drain.update(self.engine.clock(),
                num_pinned_host_blocks(snapshot.num_host_blocks, snapshot.num_free_host_blocks,
                                       snapshot.num_reclaimable_host_blocks)),
        )  # fmt: skip
        added, self._added = self._added, []
        with self._cond:
            self.snapshot = snapshot
            for request_id in added:
                self._pending.pop(request_id, None)

    def _deliver(self, items: list[tuple[str, RequestOutput | BaseException]]) -> None:
        if items and self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._on_loop, items)

    # --- event loop -----------------------------------------------------------------------
    def _on_loop(self, items: list[tuple[str, RequestOutput | BaseException]]) -> None:
        for request_id, item in items:
            if request_id in self._held:  # its first output: its prompt's KV is cached
                self.release_prompt(request_id)
            stream = self._streams.get(request_id)
            if stream is None:
                continue
            stream.queue.put_nowait(item)
            is_error = isinstance(item, BaseException)
            if is_error or item.finished:
                del self._streams[request_id]
                self._report_done(request_id, item)

    def _report_done(self, request_id: str, item: RequestOutput | BaseException) -> None:
        if self.on_done is None:
            return
        try:
            if isinstance(item, BaseException):
                self.on_done(request_id, None, item)
            else:
                self.on_done(request_id, item, None)
        except Exception:
            logger.exception("on_done callback failed for %s", request_id)


def _never_ran(add: _Add) -> RequestOutput:
    """The aborted final output of a request that never entered the engine."""
    completion = CompletionOutput(0, "", [], "abort")
    return RequestOutput(
        add.request_id, add.prompt.get("prompt"), list(add.prompt["prompt_token_ids"]),
        [completion], finished=True,
        metrics=RequestMetrics(add.arrival_time, finished_time=time.monotonic(), slo=add.slo),
    )  # fmt: skip


def _average(average_s: float, step_s: float) -> float:
    """The step-time moving average after one more step of `step_s`."""
    return step_s if not average_s else average_s + _EMA_WEIGHT * (step_s - average_s)
