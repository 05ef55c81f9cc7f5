"""A server's worker: a thread with a session of its own, running requests off the queue (one at
a time, or in batches) and answering each."""

from __future__ import annotations

import contextlib
import threading
import traceback
from typing import TYPE_CHECKING

from ..errors import InputError
from .batching import Answer, BatchBuffers, Collector, run_batch
from .request import Request

if TYPE_CHECKING:
    from .server import Server


class Worker:
    """Runs the requests of `server`'s queue on its own session until it takes a None."""

    def __init__(self, server: "Server", index: int) -> None:
        self.server = server
        self.session = server.model.session()
        options = server.options
        self.collector = Collector(server.queue, options.batch_window, options.max_batch)
        self.buffers = BatchBuffers(server.model) if options.batch_window else None
        self.thread = threading.Thread(target=self._loop, name=f"omrt-serve-worker-{index}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _loop(self) -> None:
        while (batch := self.collector.next()) is not None:
            try:
                self._serve(batch)
            except Exception:  # a fault in answering must not end the worker, and with it the queue
                traceback.print_exc()
            taken = len(batch)
            del batch  # no reference to a request outlives it: a client's memory is unmapped when it leaves
            for _ in range(taken):
                self.server.queue.task_done()
        self.session.close()

    def _serve(self, batch: list[Request]) -> None:
        """Run a batch and answer each of its requests (with the error, when the run failed)."""
        counters = self.server.counters
        live = [r for r in batch if r.connection.open]  # a client that left gets nothing run
        counters.add(running=len(live))
        answers, failure = [], None
        try:
            answers = self._run(live) if live else []
        except Exception as e:  # the requests' answer; the worker goes on
            failure = e
        counters.add(running=-len(live))
        for r in live if failure else []:
            r.connection.fail_message(r.id, failure)
        for r, returned, copied in answers:
            r.connection.result(r, returned, copied, len(answers))

    def _run(self, batch: list[Request]) -> list[Answer]:
        """Run one request, or a batch as one run; the answers to send, counted."""
        if len(batch) == 1:
            answers = [self._run_one(batch[0])]
            self.server.counters.add(runs=1)
            return answers
        answers, copied = run_batch(self.session, self.buffers, batch)
        self.server.counters.add(runs=1, batches=1, batched_requests=len(batch), bytes_copied=copied)
        return answers

    def _run_one(self, request: Request) -> Answer:
        """Run one request with its memory bound in place; its answer carries what was copied
        (nothing, when its tensors are in registered memory)."""
        session = self.session
        session.prepare({name: a.shape for name, a in request.inputs.items()})
        before = session.stats.bytes_copied
        bound = {**request.inputs, **request.outputs}
        try:
            for name, array in bound.items():
                session.bind(name, array)
            results = session.run()
        finally:
            for name in bound:  # unbinding also lets go of the kernels' pointers at the client's memory
                with contextlib.suppress(InputError):
                    session.unbind(name)
        return request, {name: results[name] for name in request.returned}, session.stats.bytes_copied - before

    @property
    def carried(self) -> int:
        return self.collector.carried

