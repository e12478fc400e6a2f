"""Launchers: how a sweep's pull workers (flctl.launch.worker) start, are known alive, and are stopped.

One class per launcher, each with a typed options dataclass (its ``[launch]`` keys; a built-in launcher's are also
its command-line flags, help and panel included: flctl.launch.settings.LaunchFlags is made from them), behind
``Launcher``:
``debug`` (in this process), ``local`` (subprocesses of this machine), ``slurm`` (job arrays), flctl's own;
an installed package adds one through the entry-point group ``flctl.launchers`` (docs/extending.md, "A launcher").
What differs between launchers is said by the launcher, as class facts and methods: nothing outside this package
compares a launcher's name.

Two kinds of workers: a launcher's workers run as processes flctl can see on this host (``queued`` False: they
are known alive and stopped by their processes, from the files they leave under results/jobs/), or as jobs of a
scheduler (``queued`` True: alive while the scheduler lists their job ids, stopped through it)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from flctl.errors import ConfigError
from flctl.registry import entry_names, load_named
from flctl.shell import STOP_SIGNALS

GROUP = "flctl.launchers"
# flctl's own launchers, by name: their modules are imported on first use (the CLI reads the names at start-up).
BUILT_IN = {"debug": "flctl.launch.backends.debug:Debug", "local": "flctl.launch.backends.local:Local",
            "slurm": "flctl.launch.backends.slurm:Slurm"}


@dataclass(frozen=True)
class Slot:
    """Where one worker runs: its index, its torch intra-op threads and, on GPUs, its CUDA_VISIBLE_DEVICES and the
    workers that share that GPU (--per-gpu: a Slurm job runs them as tasks of one job)."""

    index: int
    threads: int | None = None
    cuda: str | None = None
    shared: int = 1

    def device(self, asked: str) -> str:
        """The device a cell that asks for ``asked`` trains on in this slot: a slot that gives its worker one GPU
        (CUDA_VISIBLE_DEVICES, the local launcher's --device cuda:N) makes that GPU the process's cuda:0, where
        cuda:N would not exist. The device is not part of a run's identity: the run is the same."""
        if self.cuda is None or "," in self.cuda or not asked.startswith("cuda:"):
            return asked
        return "cuda"


class JobBody(Protocol):
    """What a launcher starts once per slot: a picklable callable (flctl.launch.worker.Worker) and the name its jobs
    are listed under (flctl-<sweep id>)."""

    @property
    def name(self) -> str: ...

    def __call__(self, slot: Slot) -> Any: ...


def option(help: str, default: Any = None) -> Any:
    """A field of a launcher's Options: a ``[launch]`` key and, for flctl's own launchers, the flag ``--NAME`` with
    this help text in the launcher's help panel (its ``title``). A dict default (KEY=VALUE flags) is given as {}."""
    if isinstance(default, dict):
        return field(default_factory=dict, metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class NoOptions:
    """A launcher without options of its own."""

    def check(self) -> None:
        pass


class Launcher:
    """How one kind of worker is started, found alive and stopped. Subclass it, set ``name`` (and ``Options``, a
    frozen dataclass whose fields are the launcher's own ``[launch]`` keys, with a ``check()`` that raises
    ConfigError), and implement ``slots`` and ``start``; a ``queued`` launcher also ``active`` and ``stop``."""

    name: ClassVar[str]
    title: ClassVar[str] = ""                # its name as a person writes it in a sentence ("Slurm"); "": its name
    default_workers: ClassVar[str] = ""      # how many workers it starts without --workers, for --workers' help
    Options: ClassVar[type] = NoOptions
    runs_here: ClassVar[bool] = True         # its workers run on this machine: its devices are checked here
    in_process: ClassVar[bool] = False       # its workers run inside the launching command, which returns after them
    joins: ClassVar[bool] = False            # `flctl sweep --wait`'s own process may be one of its workers
    queued: ClassVar[bool] = False           # its workers are a scheduler's jobs (see the module's docstring)
    # the signals that ask its worker to stop (finish the epoch, checkpoint, hand its cells back)
    stop_signals: ClassVar[tuple[str, ...]] = STOP_SIGNALS
    # what its job ids look like: checked before one reaches a command or a signal
    job_id: ClassVar[re.Pattern[str]] = re.compile(r"[0-9]+|DEBUG_[0-9]+")

    def __init__(self, options: Any = None) -> None:
        self.options = self.Options() if options is None else options

    def describe(self) -> str:
        """One line for a person: the launcher and its options."""
        return self.name

    def check(self, results_root: Path, *, dry_run: bool) -> None:
        """What starting its workers needs is here (commands, a cluster that answers, paths it writes into scripts):
        ConfigError before anything is written. ``dry_run``: only what needs no running system."""

    def slots(self, cells: int, device: str, *, workers: int | None, threads: int | None, per_gpu: int
              ) -> list[Slot]:
        """The workers to start for ``cells`` cells still to do on ``device`` (a Slot each), given what the command
        asked for: --workers, --threads (None: not given) and --per-gpu."""
        raise NotImplementedError

    def start(self, worker: JobBody, slots: Sequence[Slot], folder: Path, log: Path) -> list[Any]:
        """Start ``worker`` once per slot; its jobs, each with a ``job_id`` (an in-process launcher returns after
        they ran). ``folder``: the sweep's private jobs folder; ``log``: where workers' controllers may write."""
        raise NotImplementedError

    @staticmethod
    def current_job() -> str | None:
        """Asked inside one of its workers: the id of the job it runs in (None: not inside a job). By default
        submitit's, which most launchers start their workers through."""
        import submitit

        try:
            return submitit.JobEnvironment().job_id
        except RuntimeError:  # not inside a submitit job (the debug executor runs in process)
            return None

    def active(self, job_ids: Sequence[str]) -> set[str]:
        """Of a queued launcher's ``job_ids``, those its scheduler still lists (pending or running)."""
        return set()

    def stop(self, job_ids: Sequence[str], *, hard: bool) -> None:
        """A queued launcher's jobs asked to stop (``hard``: ended now, whatever they are doing)."""

    def job_group(self, job_id: str) -> str:
        """The id its scheduler stops a job by (an array task's array)."""
        return job_id

    @staticmethod
    def cpus_here() -> int | None:
        """Asked inside one of its jobs: the CPUs the job was given, where the job system says (None: torch's own
        choice, a thread per core of this machine)."""
        return None


class SubmititLauncher(Launcher):
    """A launcher through one of submitit's executors (``cluster``): a job array of the worker, one task per slot."""

    cluster: ClassVar[str]

    def parameters(self, slots: Sequence[Slot]) -> tuple[dict[str, Any], list[Slot]]:
        """submitit's parameters for these slots' jobs, and the slots that get a job each."""
        return {}, list(slots)

    def start(self, worker: JobBody, slots: Sequence[Slot], folder: Path, log: Path) -> list[Any]:
        import submitit

        ex = submitit.AutoExecutor(folder=str(folder), cluster=self.cluster)
        params, slots = self.parameters(slots)
        ex.update_parameters(**{"name": worker.name, "timeout_min": 7 * 24 * 60, **params})
        return ex.map_array(worker, list(slots))


def built_in() -> list[type[Launcher]]:
    """flctl's own launchers, in order (their modules are small: the CLI reads their options for its flags)."""
    return [get_launcher(name) for name in BUILT_IN]


def names() -> list[str]:
    """Every launcher's name: flctl's own, then installed ones."""
    return entry_names(GROUP, BUILT_IN)


def get_launcher(name: str) -> type[Launcher]:
    """The launcher class named ``name`` (ConfigError naming the choices otherwise)."""
    return load_named(GROUP, BUILT_IN, name, "launcher", Launcher, "unknown executor")


def make_launcher(name: str, options: Any = None) -> Launcher:
    """Launcher ``name`` with ``options``. An installed one is guarded: a fault of its own code (an exception from
    it, slots that are not Slots, jobs without a job_id) is one ConfigError naming it and its module, not a
    traceback from inside flctl, and its slots are checked before anything is written."""
    cls = get_launcher(name)
    if cls.__module__.split(".")[0] == "flctl":
        return cls(options)
    return _guarded(cls, "the launcher's constructor", lambda: cls(options))      # type: ignore[return-value]


# The calls of the Launcher interface that an installed launcher's own code answers.
_CALLS = ("describe", "check", "slots", "start", "active", "stop", "job_group", "cpus_here")


class _Installed:
    """An installed launcher, each call of the interface guarded (make_launcher); its class facts read through."""

    def __init__(self, launcher: Launcher) -> None:
        self._launcher = launcher

    def __getattr__(self, attr: str) -> Any:
        value = getattr(self._launcher, attr)
        if attr not in _CALLS:
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            result = _guarded(type(self._launcher), f"{attr}()", lambda: value(*args, **kwargs))
            if attr == "slots" and not (isinstance(result, list) and all(isinstance(s, Slot) for s in result)):
                raise _fault(type(self._launcher), "slots()", f"returned {result!r:.80}, not a list of Slot")
            if attr == "start" and not (isinstance(result, list) and all(
                    isinstance(getattr(job, "job_id", None), str) for job in result)):
                raise _fault(type(self._launcher), "start()", f"returned {result!r:.80}, not a list of jobs, each "
                             "with a job_id (a str)")
            return result
        return call


def _guarded(cls: type[Launcher], what: str, call: Any) -> Any:
    try:
        result = call()
    except ConfigError:
        raise
    except Exception as exc:   # noqa: BLE001 - its own code: told as its fault, in one line
        hint = " (written for another flctl? docs/extending.md, 'A launcher')" if isinstance(exc, TypeError) else ""
        raise _fault(cls, what, f"{type(exc).__name__}: {exc}{hint}") from None
    return _Installed(result) if isinstance(result, Launcher) else result


def _fault(cls: type[Launcher], what: str, why: str) -> ConfigError:
    return ConfigError(f"the installed launcher {cls.name!r} ({cls.__module__}.{cls.__qualname__}): {what} {why}")

