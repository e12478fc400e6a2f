"""What a GPU would catch, caught on a CPU: recorders that run flctl's CUDA code paths without CUDA.

- ``ExternalInputs``: the tensors a step reads but does not make, with their storages' addresses. A CUDA graph reads
  them by the addresses they had when it was captured; one that moves between epochs is a graph reading freed memory.
- ``StreamRecorder``: fake CUDA streams in place of torch.cuda's, and the last stream that wrote each storage. A read
  on stream S of memory last written on stream T, with no wait of S for T since (``wait_stream``, a host sync), is a
  race on a GPU: S may run before T's write lands.
"""

from __future__ import annotations

import contextlib
import threading
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


def storage_of(t: Tensor) -> int | None:
    try:
        return t.untyped_storage().data_ptr() if t.numel() else None
    except (RuntimeError, NotImplementedError):      # tensors without storage (functorch's wrappers)
        return None


class ExternalInputs(TorchDispatchMode):
    """Records, in order, each tensor the ops under it read whose storage none of them made. The tensors are kept
    alive, so no later allocation can take their addresses."""

    def __init__(self) -> None:
        super().__init__()
        self.produced: set[int] = set()
        self.external: list[tuple[str, int, tuple[int, ...], Tensor]] = []
        self._seen: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # lift_fresh: `torch.tensor(constant)` made inside the step (a constant, which a graph keeps as it is)
        for t in () if func is torch.ops.aten.lift_fresh.default else tree_leaves((args, kwargs)):
            if isinstance(t, Tensor) and (p := storage_of(t)) is not None and p not in self.produced \
                    and p not in self._seen:
                self._seen.add(p)
                self.external.append((str(func), p, tuple(t.shape), t))
        out = func(*args, **kwargs)
        for o in tree_leaves(out):
            if isinstance(o, Tensor) and (p := storage_of(o)) is not None:
                self.produced.add(p)
        return out

    @property
    def addresses(self) -> list[int]:
        return [p for _, p, _, _ in self.external]


@dataclass(eq=False)
class FakeStream:
    """A CUDA stream's ordering, without a device: a clock of the ops queued on it and how far it has waited for
    each other stream."""

    name: str
    recorder: StreamRecorder
    clock: int = 0
    waited: dict[str, int] = field(default_factory=dict)

    def wait_stream(self, other: FakeStream) -> None:
        """Wait for what ``other`` has queued so far, and with it for all ``other`` itself waited for (a CUDA stream
        waits for an event recorded on the other: everything ordered before that point comes before)."""
        for name, at in [*other.waited.items(), (other.name, other.clock)]:
            self.waited[name] = max(self.waited.get(name, 0), at)

    def synchronize(self) -> None:           # the host waits: whatever it queues next comes after
        self.recorder.host_synced[self.name] = self.clock

    def __repr__(self) -> str:
        return f"<stream {self.name}>"


@dataclass
class Race:
    op: str
    stream: str
    written_on: str
    where: str


class StreamRecorder(TorchDispatchMode):
    """Every op runs on the calling thread's current fake stream. A write is an op's fresh output or an argument its
    schema marks as written; each read is checked against the last write of its storage."""

    def __init__(self) -> None:
        super().__init__()
        self.default = FakeStream("default", self)
        self.host_synced: dict[str, int] = {}
        self.last_write: dict[int, tuple[FakeStream, int]] = {}
        self.races: list[Race] = []
        self.streams_used: set[str] = set()
        self.streams = [self.default]
        self._local = threading.local()

    @property
    def current(self) -> FakeStream:
        return getattr(self._local, "stream", self.default)

    @contextlib.contextmanager
    def stream(self, stream: FakeStream | None) -> Iterator[None]:
        before = self.current
        self._local.stream = stream if stream is not None else before
        try:
            yield
        finally:
            self._local.stream = before

    def new_stream(self, name: str) -> FakeStream:
        self.streams.append(FakeStream(name, self))
        return self.streams[-1]

    def synchronize(self, device: Any = None) -> None:      # torch.cuda.synchronize: the host waits for them all
        for s in self.streams:
            s.synchronize()

    def _ordered(self, reader: FakeStream, writer: FakeStream, at: int) -> bool:
        return reader is writer or max(reader.waited.get(writer.name, 0), self.host_synced.get(writer.name, 0)) >= at

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        s = self.current
        self.streams_used.add(s.name)
        written: list[Tensor] = []
        if func in (torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default):
            # torch.tensor(...) made from Python data just now (torch's CPU Adam adds such a 1 to its step counts):
            # memory of a tensor freed earlier begins a new life here, on this stream. (CUDA's caching allocator
            # hands a block freed on one stream to another only in order; the recorder sees a reused address.)
            written += [t for t in tree_leaves(args) if isinstance(t, Tensor)]
            args_checked: tuple = ()
        else:
            args_checked = (args, kwargs)
        schema = func._schema
        for i, arg in enumerate(schema.arguments):
            value = args[i] if i < len(args) else kwargs.get(arg.name)
            if arg.alias_info is not None and arg.alias_info.is_write:
                written += [t for t in tree_leaves(value) if isinstance(t, Tensor)]
        for t in tree_leaves(args_checked):
            if isinstance(t, Tensor) and (p := storage_of(t)) is not None and p in self.last_write:
                writer, at = self.last_write[p]
                if not self._ordered(s, writer, at):
                    self.races.append(Race(str(func), s.name, writer.name, _caller()))
        out = func(*args, **kwargs)
        s.clock += 1
        if func is torch.ops.aten._local_scalar_dense.default:     # `.item()`: the host waits for this stream
            s.synchronize()
        inputs = {storage_of(t) for t in tree_leaves((args, kwargs)) if isinstance(t, Tensor)}
        fresh = [o for o in tree_leaves(out) if isinstance(o, Tensor) and storage_of(o) not in inputs]
        for t in written + fresh:
            if (p := storage_of(t)) is not None:
                self.last_write[p] = (s, s.clock)
        return out


def _caller() -> str:
    """The innermost flctl frame of the current stack: where the racing op was issued."""
    for frame in reversed(traceback.extract_stack()):
        if "/flctl/" in frame.filename or "/flctl_tasks/" in frame.filename or "/tasks/" in frame.filename:
            return f"{frame.filename.rsplit('/', 2)[-2]}/{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}"
    return "?"


@contextlib.contextmanager
def fake_cuda_streams(monkeypatch: Any) -> Iterator[StreamRecorder]:
    """torch.cuda's stream API answered by a StreamRecorder, and flctl's worker stream made one of its fake streams,
    so that flctl's CUDA stream hand-overs run on a CPU under the recorder."""
    import flctl.stepper

    rec = StreamRecorder()
    monkeypatch.setattr(torch.cuda, "stream", rec.stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: rec.current)
    monkeypatch.setattr(torch.cuda, "synchronize", rec.synchronize)
    made = iter(range(1000))
    monkeypatch.setattr(flctl.stepper, "worker_stream", lambda device: rec.new_stream(f"worker{next(made)}"))
    with rec:
        yield rec
