"""The generation worker: one thread runs the jobs one after another (a model must not run two
generations interleaved: the KV caches and the global RNG would mix) while the event loop keeps
accepting requests; a client that hangs up cancels its job, waiting or running.
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
    SamplingParams,
    TextStream,
)
from minimind_lib.inference.serve.errors import ServerBusy
from minimind_lib.tokenizer.bpe import BPETokenizer

MAX_WAITING = 64  # requests queued behind the running one before 503

# --------------------------------------------------------------------------- the worker


@dataclass
class _Job:
    prompt_ids: list[int]
    params: SamplingParams
    stop: set[int]
    loop: asyncio.AbstractEventLoop
    pixel_values: torch.Tensor | None = None  # a picture for a VLM (1, 3, H, W)
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancel: threading.Event = field(default_factory=threading.Event)

    def emit(self, kind: str, value: object) -> None:  # called from the worker thread
        if self.loop.is_closed():  # the server shut down mid-generation: nobody is listening
            self.cancel.set()
            return
        self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))


class Engine:
    """Runs generation jobs one at a time on a worker thread; results stream back to asyncio.

    subtle: serialising is what makes concurrent requests *correct*: a greedy answer is
    the same whether it ran alone or among 64 others. At most ``max_waiting`` jobs wait
    (cancelled ones do not count); one more is refused with ``ServerBusy``.
    """

    def __init__(self, model: nn.Module, tokenizer: BPETokenizer,
                 max_waiting: int = MAX_WAITING) -> None:
        self.model, self.tokenizer = model.eval(), tokenizer
        self.max_waiting = max_waiting
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._waiting: list[_Job] = []  # submitted, not yet started
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def waiting(self) -> int:
        """Jobs queued and not cancelled."""
        with self._lock:
            return sum(not job.cancel.is_set() for job in self._waiting)

    def submit(self, prompt_ids: list[int], params: SamplingParams,
               stop: set[int], pixel_values: torch.Tensor | None = None) -> _Job:
        """Queue a job; read its events with ``events(job)``."""
        waiting = self.waiting
        if waiting >= self.max_waiting:
            raise ServerBusy(waiting)
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._work, name="minimind-generate",
                                                daemon=True)
                self._thread.start()
            job = _Job(prompt_ids, params, stop, asyncio.get_running_loop(), pixel_values)
            self._waiting.append(job)
        self._jobs.put(job)
        return job

    async def events(self, job: _Job) -> AsyncIterator[tuple[str, object]]:
        """("text", chunk) ... then ("done", TextStream), ("error", exception) or
        ("cancelled", None) for a job cancelled before it started."""
        try:
            while True:
                kind, value = await job.events.get()
                yield kind, value
                if kind != "text":
                    return
        finally:
            job.cancel.set()  # a client that disconnects mid-stream frees the worker

    def close(self) -> None:
        """Stop the worker thread after the queued jobs."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join(timeout=30)

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            with self._lock:
                self._waiting.remove(job)
            if job.cancel.is_set():
                job.emit("cancelled", None)
                continue
            try:
                stream = TextStream(self.model, self.tokenizer, job.prompt_ids, job.params,
                                    job.stop, cancelled=job.cancel.is_set,
                                    pixel_values=job.pixel_values)
                with torch.inference_mode():
                    for chunk in stream:
                        job.emit("text", chunk)
                job.emit("done", stream)
            except Exception as e:  # reported to the client, the worker lives on
                job.emit("error", e)


async def _cancel_when_gone(request: Request, job: _Job) -> None:
    """Cancel ``job`` once the client hangs up (its request body is read, so the next ASGI
    message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    job.cancel.set()
