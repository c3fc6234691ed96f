"""The generation worker: one thread owns the model (two generations must never interleave on
it: the KV caches and the global RNG would mix) while the event loop keeps accepting requests; a
client that hangs up cancels its job, waiting or running.

A ``MiniMindForCausalLM`` is served by **continuous batching** (``model.generation.
ContinuousBatch``): requests that arrive while others decode join the running batch at the next
step, each row at its own positions in a shared static KV cache, with its own sampling settings,
seed, stop ids and budget; a finished or abandoned row leaves and the next waiting request takes
its slot. A greedy answer is the same as alone: rows never read each other's keys. Other models
(a vision-language model, a test's stand-in) run one job at a time (``TextStream``).
"""


import asyncio
import queue
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import torch
from fastapi import Request
from torch import nn

from minimind_lib.inference.chat import (
    ReplyText,
    SamplingParams,
    TextStream,
    check_budget,
    context_length,
    model_device,
    seeded_generator,
)
from minimind_lib.inference.serve.errors import ServerBusy
from minimind_lib.model.decoder import MiniMindForCausalLM
from minimind_lib.model.generation import ContinuousBatch, Row
from minimind_lib.tokenizer.bpe import BPETokenizer

MAX_WAITING = 64  # requests queued (not yet decoding) before 503
MAX_BATCH = 32  # requests decoding together (continuous batching)
#: positions per row the batch's KV cache holds at first; it doubles as answers grow (up to
#: the model's context), so a server with a 32k context does not hold 32k x MAX_BATCH at once
INITIAL_CACHE = 256

# --------------------------------------------------------------------------- the worker


@dataclass
class _Job:
    prompt_ids: list[int]
    params: SamplingParams
    stop: set[int]
    loop: asyncio.AbstractEventLoop
    pixel_values: torch.Tensor | None = None  # a picture for a VLM (1, 3, H, W)
    constraint: object = None  # a grammar (inference.structured.Constraint) the reply follows
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancel: threading.Event = field(default_factory=threading.Event)

    def emit(self, kind: str, value: object) -> None:  # called from the worker thread
        if self.loop.is_closed():  # the server shut down mid-generation: nobody is listening
            self.cancel.set()
            return
        self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))


class Engine:
    """Runs generation jobs on a worker thread; results stream back to asyncio.

    A ``MiniMindForCausalLM`` decodes up to ``max_batch`` jobs together (see the module);
    other models one at a time. At most ``max_waiting`` jobs wait for a place (cancelled ones
    do not count); one more is refused with ``ServerBusy``.
    """

    def __init__(self, model: nn.Module, tokenizer: BPETokenizer,
                 max_waiting: int = MAX_WAITING, max_batch: int = MAX_BATCH) -> None:
        if max_batch < 1 or max_waiting < 0:
            raise ValueError(f"max_batch must be >= 1 and max_waiting >= 0, got {max_batch} "
                             f"and {max_waiting}")
        self.model, self.tokenizer = model.eval(), tokenizer
        self.max_waiting = max_waiting
        #: whether jobs decode together (continuous batching); others run one at a time
        self.batched = isinstance(model, MiniMindForCausalLM)
        self.max_batch = max_batch if self.batched else 1
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._waiting: list[_Job] = []  # submitted, not yet started
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def waiting(self) -> int:
        """Jobs queued, not yet decoding, and not cancelled."""
        with self._lock:
            return sum(not job.cancel.is_set() for job in self._waiting)

    def submit(self, prompt_ids: list[int], params: SamplingParams,
               stop: set[int], pixel_values: torch.Tensor | None = None,
               constraint: object = None) -> _Job:
        """Queue a job; read its events with ``events(job)``."""
        waiting = self.waiting
        if waiting >= self.max_waiting:
            raise ServerBusy(waiting)
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                work = self._work_batched if self.batched else self._work
                self._thread = threading.Thread(target=work, name="minimind-generate",
                                                daemon=True)
                self._thread.start()
            job = _Job(prompt_ids, params, stop, asyncio.get_running_loop(), pixel_values,
                       constraint)
            self._waiting.append(job)
        self._jobs.put(job)
        return job

    async def events(self, job: _Job) -> AsyncIterator[tuple[str, object]]:
        """("text", chunk) ... then ("done", ReplyText), ("error", exception) or
        ("cancelled", None) for a job cancelled before it started."""
        try:
            while True:
                kind, value = await job.events.get()
                yield kind, value
                if kind != "text":
                    return
        finally:
            job.cancel.set()  # a client that disconnects mid-stream frees its place

    def close(self) -> None:
        """Stop the worker thread after the queued jobs."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join(timeout=30)

    def _next_job(self, block: bool) -> _Job | None | bool:
        """The next queued job, taken off the waiting list; None: ``close`` was called; False:
        none queued (without ``block``)."""
        try:
            job = self._jobs.get(block=block)
        except queue.Empty:
            return False
        if job is not None:
            with self._lock:
                self._waiting.remove(job)
        return job

    def _work(self) -> None:
        """One job at a time (a model that cannot batch)."""
        while (job := self._next_job(block=True)) is not None:
            if job.cancel.is_set():
                job.emit("cancelled", None)
                continue
            try:
                stream = TextStream(self.model, self.tokenizer, job.prompt_ids, job.params,
                                    job.stop, cancelled=job.cancel.is_set,
                                    pixel_values=job.pixel_values, constraint=job.constraint)
                with torch.inference_mode():
                    for chunk in stream:
                        job.emit("text", chunk)
                job.emit("done", stream)
            except Exception as e:  # reported to the client, the worker lives on
                job.emit("error", e)

    def _work_batched(self) -> None:
        """Continuous batching: take queued jobs while there are free places, one step for all
        rows, send each row's text, finish the rows that ended."""
        batch = self._new_batch()
        running: dict[Row, tuple[_Job, ReplyText]] = {}
        closing = False
        while not closing or running:
            while not closing and len(running) < self.max_batch:
                job = self._next_job(block=not running)
                if job is False:
                    break
                if job is None:
                    closing = True
                elif job.cancel.is_set():
                    job.emit("cancelled", None)
                else:
                    self._start(batch, running, job)
            for row, (job, _) in running.items():
                if job.cancel.is_set() and row.finish_reason is None:
                    row.finish_reason = "cancelled"  # leaves the batch at this step
            try:
                with torch.inference_mode():
                    emitted = batch.step()
            except Exception as e:  # a bug, not a request's fault: every row is told
                for job, _ in running.values():
                    job.emit("error", e)
                running.clear()
                batch = self._new_batch()
                continue
            for row, token in emitted:
                job, reply = running[row]
                chunk = reply.push(token)
                if chunk:
                    job.emit("text", chunk)
            for row in [r for r in running if r.finish_reason is not None]:
                job, reply = running.pop(row)
                tail = reply.end(row.finish_reason)
                if tail:
                    job.emit("text", tail)
                job.emit("done", reply)

    def _new_batch(self) -> ContinuousBatch:
        context = context_length(self.model)
        return ContinuousBatch(self.model, context, self.max_batch,
                               initial_capacity=min(INITIAL_CACHE, context))

    def _start(self, batch: ContinuousBatch, running: dict, job: _Job) -> None:
        """Add ``job`` to the batch as a row (it joins at the next step)."""
        p = job.params
        try:
            check_budget(self.model, job.prompt_ids, p)
            row = batch.submit(Row(torch.tensor(job.prompt_ids), p.max_new_tokens,
                                   frozenset(job.stop), p.temperature, p.top_k, p.top_p,
                                   seeded_generator(p.seed, model_device(self.model)),
                                   constraint=(None if job.constraint is None
                                               else job.constraint.start())))
        except Exception as e:
            job.emit("error", e)
            return
        running[row] = (job, ReplyText(self.tokenizer, job.stop))


async def _cancel_when_gone(request: Request, job: _Job) -> None:
    """Cancel ``job`` once the client hangs up (its request body is read, so the next ASGI
    message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    job.cancel.set()
