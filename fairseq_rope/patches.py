"""Every change fairseq-rope makes to fairseq and torch, declared in one place.

Importing :mod:`fairseq_rope` (as ``--user-dir fairseq_rope`` does) calls
:func:`apply_patches`, which applies each patch of :data:`PATCHES` unless its
opt-out variable ``FAIRSEQ_ROPE_NO_<NAME>`` is set (to ``1``, ``true`` or
``yes``). Nothing else in the package changes fairseq or torch. Each patch
names its target, what it changes and the failure it prevents, and guards its
target: before wrapping, it checks that the target still looks as this code
expects (fairseq-fixed 0.12.3.1, torch >= 2.6). On a mismatch a patch either
refuses (raises :class:`PatchError`, which stops the import) or warns
(:class:`PatchWarning`) and leaves the target alone:

* the safe-loading patches (``SAFE_GLOBALS``, ``SAFE_LOADER``) refuse: skipped
  silently they would leave checkpoints loading unsafely or not at all, and
  only the user may choose that, with the opt-out variable;
* the resume patches (``BROADCAST_LOAD``, ``ATOMIC_COPY``, ``RESUME_BATCHES``) warn and skip:
  without them fairseq behaves as it does without the plugin, so the models
  stay usable; only a resumed training run may differ;
* ``BF16_DEVICE`` warns and skips too: without it ``--bf16`` means TPU, as in
  fairseq, and bf16 on a GPU fails as it does there;
* so does ``PREFETCH_EXIT``: without it a process may abort at exit, as fairseq's does.

Patches wrap fairseq's functions and call the originals; none copies fairseq code.
See ``docs/patches.md`` for the table.

Resume fixes
------------
fairseq resumes from ``checkpoint_last.pt`` with the model, optimizer and lr
schedule state and the position in the epoch, and reseeds torch before every
update (``seed + num_updates``), so dropout masks do not depend on when the
process started. Three things still broke a resume:

1. **A truncated checkpoint_last.pt.** fairseq writes the first file of a save
   atomically (``NAME.tmp``, then rename) but makes the others,
   ``checkpoint_last.pt`` and ``checkpoint_best.pt`` among them, with
   ``PathManager.copy``: on local disks a plain ``shutil.copyfile``. A kill
   during that copy leaves a truncated ``checkpoint_last.pt`` that every later
   resume fails to load. Local copies now go through
   :func:`fairseq_rope.base.atomic_path` (a temporary file renamed over the
   target), so a kill leaves the previous, complete checkpoint (``ATOMIC_COPY``).

2. **Other batches after a resume.** fairseq (main, which fairseq-fixed
   0.12.3.1 is) groups sentences into batches once, when the epoch iterator is
   first built, with ``numpy_seed(seed + epoch)``, and then reuses those
   batches in every epoch (only their order is reshuffled per epoch). An
   uninterrupted run builds them in epoch 1; a run resumed in epoch E built
   them with ``seed + E``: other batches from then on, and a different model.
   :func:`~fairseq.tasks.FairseqTask.get_batch_iterator` now builds reusable
   iterators' batches as in epoch 1 (``RESUME_BATCHES``). Iterators rebuilt
   every epoch (sharded data, ``rebuild_batches`` tasks) already agree between
   the two runs and are left alone.

3. **Every rank but 0 of a multi-process run.** Rank 0 loads the checkpoint
   and broadcasts its state (``broadcast_object``); the other ranks unpickle it
   with ``torch.load`` and torch's ``weights_only`` default, which refuses the
   ``DictConfig`` fairseq made of the args. Those bytes are no file: rank 0
   pickled them from memory after loading the file safely, so
   ``fairseq.distributed.utils`` (only) reads them in full (``BROADCAST_LOAD``).

With the first two, a run SIGKILLed at any point and rerun unchanged ends, on CPU, with
the same bits as a run never interrupted (``tests/test_resume.py``).

``RESUME_BATCHES`` is on by default, for every task trained with the plugin,
stock ``transformer`` baselines included: it changes nothing in a run that is
never interrupted, nor in one resumed in epoch 1, and makes a run resumed in a
later epoch bit-identical to the uninterrupted run. Stock fairseq would give
the resumed run other batches; ``FAIRSEQ_ROPE_NO_RESUME_BATCHES=1`` restores
that behaviour, and each rebuild is logged.
"""

from __future__ import annotations

import atexit
import functools
import importlib.util
import inspect
import logging
import os
import queue
import threading
import time
import types
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Iterator, Mapping, Optional, Sequence, Tuple

import torch
from fairseq import checkpoint_utils
from fairseq.data import iterators
from fairseq.file_io import PathManager
from fairseq.tasks import FairseqTask

from fairseq_rope.base import FairseqRopeError, atomic_path
from fairseq_rope.checkpoints import FAIRSEQ_CHECKPOINT_GLOBALS, refusing_unsafe

logger = logging.getLogger(__name__)

OPT_OUT_PREFIX = "FAIRSEQ_ROPE_NO_"
_TRUE = frozenset({"1", "true", "yes", "y", "on"})
# Set on every wrapper this module installs, to the name of its patch: how idempotence is checked.
_MARK = "_fairseq_rope_patch"


class PatchError(FairseqRopeError):
    """A safety patch whose target is not what fairseq-rope expects: applying it could be wrong."""


class PatchWarning(UserWarning):
    """A resume patch skipped because its target is not what fairseq-rope expects."""


@dataclass(frozen=True)
class Patch:
    """One change to fairseq or torch, with the check that its target is still what it wraps.

    ``guard`` returns ``None`` when the target is as expected (``expected`` says how),
    else what it found instead; ``refuse`` chooses :class:`PatchError` over a warning.
    """

    name: str
    target: str
    changes: str
    why: str
    expected: str
    guard: Callable[[], Optional[str]]
    install: Callable[[], None]
    active: Callable[[], bool]
    refuse: bool

    @property
    def opt_out(self) -> str:
        """The environment variable that disables this patch."""
        return OPT_OUT_PREFIX + self.name

    def enabled(self, environ: Mapping[str, str] = os.environ) -> bool:
        """False when :attr:`opt_out` is set to a true value (1, true, yes, y, on) in ``environ``."""
        return environ.get(self.opt_out, "").strip().lower() not in _TRUE

    def apply(self) -> bool:
        """Apply this patch unless it is active already; whether it is active afterwards.

        Ignores the opt-out (see :func:`apply_patches`). A mismatched target, or one whose
        source the guard cannot read, raises :class:`PatchError` (``refuse``) or warns and
        is left untouched.
        """
        if self.active():
            return True
        try:
            found = self.guard()
        except OSError as error:  # inspect.getsource on an install without source files
            found = f"a target whose source cannot be read ({error})"
        if found is not None:
            message = (
                f"fairseq-rope patch {self.name} cannot be applied to {self.target}: expected "
                f"{self.expected}, found {found}. Set {self.opt_out}=1 to run without it "
                f"(it prevents: {self.why})"
            )
            if self.refuse:
                raise PatchError(message)
            warnings.warn(message + "; skipped", PatchWarning, stacklevel=3)
            return False
        self.install()
        return True


def _parameters(function: Any) -> Tuple[str, ...]:
    return tuple(inspect.signature(function).parameters)


def _signature_problem(function: Any, expected: Sequence[str]) -> Optional[str]:
    """``None`` if ``function`` (unwrapped) takes exactly ``expected``, else its signature."""
    try:
        found = _parameters(inspect.unwrap(function))
    except (TypeError, ValueError):
        return f"{function!r} without a readable signature"
    return None if found == tuple(expected) else f"parameters {found}"


def _marked(obj: Any, name: str) -> bool:
    return getattr(obj, _MARK, None) == name


# ----------------------------------------------------------------------------- SAFE_GLOBALS


def _safe_globals_guard() -> Optional[str]:
    serialization = torch.serialization
    for function, parameters in (("add_safe_globals", ("safe_globals",)), ("get_safe_globals", ())):
        if not callable(getattr(serialization, function, None)):
            return f"torch {torch.__version__} without torch.serialization.{function}"
        problem = _signature_problem(getattr(serialization, function), parameters)
        if problem:
            return f"torch.serialization.{function} with {problem}"
    return None


def _allow_fairseq_checkpoint_globals() -> None:
    torch.serialization.add_safe_globals(list(FAIRSEQ_CHECKPOINT_GLOBALS))


def _fairseq_checkpoint_globals_allowed() -> bool:
    get = getattr(torch.serialization, "get_safe_globals", None)
    return callable(get) and all(g in get() for g in FAIRSEQ_CHECKPOINT_GLOBALS)


# ----------------------------------------------------------------------------- SAFE_LOADER


def weights_only_load(f: Any, *args: Any, **kwargs: Any) -> Any:
    """``torch.load`` with ``weights_only=True`` whatever the caller or the environment says.

    An explicit ``weights_only`` is the one thing ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD``
    does not override, so no environment variable needs to change.
    """
    kwargs["weights_only"] = True
    return torch.load(f, *args, **kwargs)


class TorchWithLoad(types.ModuleType):
    """``torch`` as one fairseq module sees it: the same module, but another ``load``.
    Installed only as that module's global ``torch``; torch itself and every other module
    keep the real ``torch.load``."""

    def __init__(self, module: types.ModuleType, load: Callable[..., Any], seen_by: str) -> None:
        super().__init__(module.__name__, module.__doc__)
        self._torch = module
        self._seen_by = seen_by
        self.load = load

    def __getattr__(self, name: str) -> Any:  # only for what the instance lacks: all but load
        module = self.__dict__.get("_torch")
        if module is None:
            raise AttributeError(name)
        return getattr(module, name)

    def __repr__(self) -> str:
        return f"<module 'torch' as {self._seen_by} sees it: load is {__name__}.{self.load.__name__}>"


def _torch_seen_by(module: types.ModuleType, load: Callable[..., Any]) -> bool:
    """Whether ``module``'s global ``torch`` is torch with ``load`` as its load."""
    seen = getattr(module, "torch", None)
    return isinstance(seen, TorchWithLoad) and seen.load is load


_LOAD_CHECKPOINT_PARAMETERS = ("path", "arg_overrides", "load_on_all_ranks")


def _safe_loader_guard() -> Optional[str]:
    load = checkpoint_utils.load_checkpoint_to_cpu
    problem = _signature_problem(load, _LOAD_CHECKPOINT_PARAMETERS)
    if problem:
        return problem
    names = getattr(getattr(inspect.unwrap(load), "__code__", None), "co_names", ())
    if "torch" not in names or "load" not in names:
        return "a function that does not call torch.load through its module's global torch"
    if checkpoint_utils.torch is not torch and not _torch_seen_by(checkpoint_utils, weights_only_load):
        return f"fairseq.checkpoint_utils.torch = {checkpoint_utils.torch!r}"
    return None


def _safe_fairseq_loader(load: Callable[..., Dict[str, Any]]) -> Callable[..., Dict[str, Any]]:
    @functools.wraps(load)
    def load_checkpoint_to_cpu(path: Any, *args: Any, **kwargs: Any) -> Dict[str, Any]:
        with refusing_unsafe(path):  # a refusal that names the file
            return load(path, *args, **kwargs)

    setattr(load_checkpoint_to_cpu, _MARK, "SAFE_LOADER")
    return load_checkpoint_to_cpu


def _install_safe_loader() -> None:
    # fairseq's loader reads the file with its module global ``torch``: make that one safe.
    if not _torch_seen_by(checkpoint_utils, weights_only_load):
        checkpoint_utils.torch = TorchWithLoad(torch, weights_only_load, "fairseq.checkpoint_utils")
    # Callers look the function up on the module (checkpoint_utils.load_checkpoint_to_cpu).
    if not _marked(checkpoint_utils.load_checkpoint_to_cpu, "SAFE_LOADER"):
        checkpoint_utils.load_checkpoint_to_cpu = _safe_fairseq_loader(checkpoint_utils.load_checkpoint_to_cpu)


def _safe_loader_active() -> bool:
    return (_torch_seen_by(checkpoint_utils, weights_only_load)
            and _marked(checkpoint_utils.load_checkpoint_to_cpu, "SAFE_LOADER"))


# ----------------------------------------------------------------------------- BROADCAST_LOAD


def broadcast_load(f: Any, *args: Any, **kwargs: Any) -> Any:
    """``torch.load`` of the bytes another rank's ``broadcast_object`` pickled, in full.

    Not a file: what the source rank's ``torch.save`` wrote of an object it holds in
    memory (the trainer's state, optimizer state, tensor metadata). Anything of a
    checkpoint file's in it went through the source rank's safe load first, which
    refuses all but :data:`~fairseq_rope.checkpoints.FAIRSEQ_CHECKPOINT_GLOBALS`; the
    rest (fairseq's DictConfig, its tensor placeholders) the job's own code made. The
    ranks already trust each other's pickles: fairseq's ``all_gather_list`` unpickles
    them with ``pickle.loads``.
    """
    kwargs["weights_only"] = False
    return torch.load(f, *args, **kwargs)


def _broadcast_load_guard() -> Optional[str]:
    from fairseq.distributed import utils as distributed_utils

    slow = getattr(distributed_utils, "_broadcast_object_slow", None)
    if not callable(slow):
        return "no fairseq.distributed.utils._broadcast_object_slow"
    names = getattr(getattr(inspect.unwrap(slow), "__code__", None), "co_names", ())
    if "torch" not in names or "load" not in names:
        return "a _broadcast_object_slow that does not call torch.load through its module's global torch"
    # The module's only torch.load must be the broadcast's: nothing else may read a file through it.
    if inspect.getsource(distributed_utils).count("torch.load(") != 1:
        return "fairseq.distributed.utils calling torch.load outside _broadcast_object_slow"
    if distributed_utils.torch is not torch and not _torch_seen_by(distributed_utils, broadcast_load):
        return f"fairseq.distributed.utils.torch = {distributed_utils.torch!r}"
    return None


def _install_broadcast_load() -> None:
    from fairseq.distributed import utils as distributed_utils

    if not _torch_seen_by(distributed_utils, broadcast_load):
        distributed_utils.torch = TorchWithLoad(torch, broadcast_load, "fairseq.distributed.utils")


def _broadcast_load_active() -> bool:
    from fairseq.distributed import utils as distributed_utils

    return _torch_seen_by(distributed_utils, broadcast_load)


# ----------------------------------------------------------------------------- ATOMIC_COPY


_COPY_PARAMETERS = ("src_path", "dst_path", "overwrite")


def _atomic_copy_guard() -> Optional[str]:
    if not isinstance(inspect.getattr_static(PathManager, "copy", None), staticmethod):
        return f"PathManager.copy = {inspect.getattr_static(PathManager, 'copy', None)!r}, not a staticmethod"
    if not callable(getattr(PathManager, "path_requires_pathmanager", None)):
        return "no PathManager.path_requires_pathmanager"
    return _signature_problem(PathManager.copy, _COPY_PARAMETERS)


def _install_atomic_copy() -> None:
    copy = PathManager.copy

    @functools.wraps(copy)
    def atomic_copy(src_path: str, dst_path: str, overwrite: bool = False) -> bool:
        if PathManager.path_requires_pathmanager(dst_path):  # remote storage: fairseq's own way
            return copy(src_path, dst_path, overwrite=overwrite)
        with atomic_path(dst_path) as tmp:
            copy(src_path, str(tmp), overwrite=True)
        return True

    setattr(atomic_copy, _MARK, "ATOMIC_COPY")
    PathManager.copy = staticmethod(atomic_copy)  # type: ignore[method-assign]


# ----------------------------------------------------------------------------- RESUME_BATCHES


_GET_BATCH_ITERATOR_PARAMETERS = (
    "self", "dataset", "max_tokens", "max_sentences", "max_positions", "ignore_invalid_inputs",
    "required_batch_size_multiple", "seed", "num_shards", "shard_id", "num_workers", "epoch",
    "data_buffer_size", "disable_iterator_cache", "skip_remainder_batch", "grouped_shuffling",
    "update_epoch_batch_itr",
)


def _resume_batches_guard() -> Optional[str]:
    if not callable(getattr(FairseqTask, "can_reuse_epoch_itr", None)):
        return "no FairseqTask.can_reuse_epoch_itr"
    return _signature_problem(FairseqTask.get_batch_iterator, _GET_BATCH_ITERATOR_PARAMETERS)


def _reused_across_epochs(task: FairseqTask, dataset: Any, kwargs: Mapping[str, Any]) -> bool:
    """Whether fairseq builds this iterator's batches once and reuses them in later epochs."""
    return (
        not kwargs.get("disable_iterator_cache", False)
        and not kwargs.get("update_epoch_batch_itr", False)
        and not getattr(task.cfg, "rebuild_batches", False)
        and task.can_reuse_epoch_itr(dataset)
    )


def _install_resume_batches() -> None:
    get_batch_iterator: Callable[..., Any] = FairseqTask.get_batch_iterator

    @functools.wraps(get_batch_iterator)
    def wrapper(self: FairseqTask, dataset: Any, *args: Any, **kwargs: Any) -> Any:
        epoch = kwargs.get("epoch", 1)
        if (args or epoch == 1 or dataset in self.dataset_to_epoch_iter
                or not _reused_across_epochs(self, dataset, kwargs)):
            return get_batch_iterator(self, dataset, *args, **kwargs)  # (fairseq's callers pass keywords)
        logger.info(
            "building the batches of a run resumed in epoch %d as in epoch 1, as an uninterrupted "
            "run did (%s=1 for fairseq's own)", epoch, OPT_OUT_PREFIX + "RESUME_BATCHES")
        # Batches as an uninterrupted run made them in epoch 1; then the two
        # other uses of ``epoch`` in fairseq's method: the iterator's current
        # epoch and the dataset's.
        itr = get_batch_iterator(self, dataset, **{**kwargs, "epoch": 1})
        itr.epoch = epoch
        if hasattr(dataset, "set_epoch"):
            dataset.set_epoch(epoch)
        return itr

    setattr(wrapper, _MARK, "RESUME_BATCHES")
    FairseqTask.get_batch_iterator = wrapper  # type: ignore[method-assign]


# ----------------------------------------------------------------------------- BF16_DEVICE


def _xla_installed() -> bool:
    return importlib.util.find_spec("torch_xla") is not None


def _bf16_device_guard() -> Optional[str]:
    from fairseq import options
    from fairseq.dataclass import utils as dataclass_utils

    problem = _signature_problem(dataclass_utils.override_module_args, ("args",))
    if problem:
        return f"override_module_args with {problem}"
    convert = inspect.unwrap(dataclass_utils.convert_namespace_to_omegaconf)
    if "override_module_args" not in getattr(getattr(convert, "__code__", None), "co_names", ()):
        return "a convert_namespace_to_omegaconf that does not call override_module_args by its module global"
    if "args.tpu = True" not in inspect.getsource(options.parse_args_and_arch):
        return "a parse_args_and_arch where --bf16 no longer implies --tpu (the patch is not needed)"
    return None


def _install_bf16_device() -> None:
    from fairseq.dataclass import utils as dataclass_utils

    override = dataclass_utils.override_module_args

    @functools.wraps(override)
    def override_module_args(args: Any) -> Any:
        if getattr(args, "bf16", False) and getattr(args, "tpu", False) and not _xla_installed():
            # --bf16 set --tpu (fairseq.options), which needs torch_xla: without it,
            # bf16 on the device the rest of the options choose (CUDA, or --cpu).
            logger.info("--bf16 without torch_xla: bf16 on CUDA or CPU, not TPU (%s=1 for fairseq's own)",
                        OPT_OUT_PREFIX + "BF16_DEVICE")
            args.tpu = False
        return override(args)

    setattr(override_module_args, _MARK, "BF16_DEVICE")
    dataclass_utils.override_module_args = override_module_args


def _bf16_device_active() -> bool:
    from fairseq.dataclass import utils as dataclass_utils

    return _marked(dataclass_utils.override_module_args, "BF16_DEVICE")


# ----------------------------------------------------------------------------- PREFETCH_EXIT


_CONSUMER_PARAMETERS = ("self", "queue", "source", "max_len", "cuda_device")
# How long exit waits for a prefetching thread to finish the batch it is making.
PREFETCH_EXIT_TIMEOUT_S = 60.0


def _prefetch_exit_guard() -> Optional[str]:
    consumer = getattr(iterators, "BackgroundConsumer", None)
    if not (isinstance(consumer, type) and issubclass(consumer, threading.Thread)):
        return f"fairseq.data.iterators.BackgroundConsumer = {consumer!r}"
    problem = _signature_problem(consumer.__init__, _CONSUMER_PARAMETERS)
    if problem:
        return f"BackgroundConsumer.__init__ with {problem}"
    create = inspect.unwrap(getattr(getattr(iterators, "BufferedIterator", None), "_create_consumer", None))
    if "BackgroundConsumer" not in getattr(getattr(create, "__code__", None), "co_names", ()):
        return "a BufferedIterator._create_consumer that does not start its module's BackgroundConsumer"
    return None


def _until(stop: threading.Event, source: Iterable[Any]) -> Iterator[Any]:
    """``source``'s items until ``stop`` is set (checked before each one is made)."""
    items = iter(source)
    while not stop.is_set():
        try:
            item = next(items)
        except StopIteration:
            return
        yield item


def _drain(buffer: "queue.Queue[Any]") -> None:
    try:
        while True:
            buffer.get_nowait()
    except queue.Empty:
        pass


def stop_prefetching(timeout_s: float = PREFETCH_EXIT_TIMEOUT_S) -> None:
    """Stop every running prefetching thread after the batch it is making, and wait for it.

    Runs at exit (``atexit``), before the interpreter finalizes: its batches are no longer
    wanted, so the buffer is emptied until the thread has ended (it blocks on a full one).
    An iterator whose thread it stopped cannot be read any more: call it only when done.
    """
    threads = [t for t in threading.enumerate() if _marked(t, "PREFETCH_EXIT")]
    for thread in threads:
        thread.stop_requested.set()
    deadline = time.monotonic() + timeout_s
    for thread in threads:
        while thread.is_alive() and time.monotonic() < deadline:
            _drain(thread.buffer)
            thread.join(0.05)
        if thread.is_alive():
            logger.warning("fairseq's batch prefetching thread %s still runs after %.0f s; exiting anyway",
                           thread.name, timeout_s)


def _install_prefetch_exit() -> None:
    class StoppableBackgroundConsumer(iterators.BackgroundConsumer):  # type: ignore[misc, valid-type]
        """fairseq's batch prefetching thread, which :func:`stop_prefetching` can stop."""

        def __init__(self, queue: "queue.Queue[Any]", source: Iterable[Any], max_len: Optional[int],
                     cuda_device: Optional[int]) -> None:
            self.stop_requested = threading.Event()
            self.buffer = queue
            super().__init__(queue, _until(self.stop_requested, source), max_len, cuda_device)

    setattr(StoppableBackgroundConsumer, _MARK, "PREFETCH_EXIT")
    iterators.BackgroundConsumer = StoppableBackgroundConsumer
    # Registered after torch's and multiprocessing's exit handlers, so it runs before them,
    # while DataLoader workers still serve the batch the thread waits for.
    atexit.register(stop_prefetching)


# ----------------------------------------------------------------------------- the list


PATCHES: Tuple[Patch, ...] = (
    Patch(
        name="SAFE_GLOBALS",
        target="torch.serialization safe-globals allowlist",
        changes=("adds argparse.Namespace and plain numpy arrays (torch.serialization.add_safe_globals), "
                 "process-wide"),
        why=("torch >= 2.6 loads with weights_only=True by default, and fairseq checkpoints pickle "
             "their training args as argparse.Namespace (and, trained with --eval-bleu, BLEU counts "
             "as numpy arrays): without it every such checkpoint is refused"),
        expected="torch.serialization.add_safe_globals(safe_globals) and get_safe_globals() (torch >= 2.4)",
        guard=_safe_globals_guard,
        install=_allow_fairseq_checkpoint_globals,
        active=_fairseq_checkpoint_globals_allowed,
        refuse=True,
    ),
    Patch(
        name="SAFE_LOADER",
        target="fairseq.checkpoint_utils.load_checkpoint_to_cpu",
        changes=("wraps it to name the file in refusals (UnsafeCheckpointError), and makes the torch.load "
                 "calls of fairseq.checkpoint_utils (only) pass weights_only=True"),
        why=("fairseq calls torch.load without weights_only, so TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 (a common "
             "workaround for fairseq under torch >= 2.6) would unpickle any code a checkpoint holds; "
             "torch's own refusal names neither the file nor the risk"),
        expected=("load_checkpoint_to_cpu(path, arg_overrides=None, load_on_all_ranks=False) reading the "
                  "file with torch.load through fairseq.checkpoint_utils' global torch (fairseq 0.12)"),
        guard=_safe_loader_guard,
        install=_install_safe_loader,
        active=_safe_loader_active,
        refuse=True,
    ),
    Patch(
        name="BROADCAST_LOAD",
        target="fairseq.distributed.utils._broadcast_object_slow (its torch.load)",
        changes=("the torch.load calls of fairseq.distributed.utils (only: the ranks' receipt of "
                 "broadcast_object's pickle) pass weights_only=False"),
        why=("resuming a multi-process run, rank 0 loads the checkpoint (safely) and broadcasts its state; "
             "the other ranks unpickle it with torch >= 2.6's weights_only default, which refuses fairseq's "
             "own DictConfig: every rank but 0 dies (UnpicklingError) and the run cannot resume"),
        expected=("_broadcast_object_slow(obj, src_rank, group, dist_device) calling torch.load through "
                  "fairseq.distributed.utils' global torch, the module's only torch.load (fairseq 0.12)"),
        guard=_broadcast_load_guard,
        install=_install_broadcast_load,
        active=_broadcast_load_active,
        refuse=False,
    ),
    Patch(
        name="ATOMIC_COPY",
        target="fairseq.file_io.PathManager.copy",
        changes="local copies write a temporary file and rename it over the target",
        why=("fairseq makes checkpoint_last.pt with PathManager.copy, i.e. shutil.copyfile: a kill during "
             "the copy leaves a truncated checkpoint_last.pt that no resume can load"),
        expected="staticmethod copy(src_path, dst_path, overwrite=False) and path_requires_pathmanager",
        guard=_atomic_copy_guard,
        install=_install_atomic_copy,
        active=lambda: _marked(PathManager.copy, "ATOMIC_COPY"),
        refuse=False,
    ),
    Patch(
        name="RESUME_BATCHES",
        target="fairseq.tasks.FairseqTask.get_batch_iterator",
        changes=("an iterator whose batches are reused across epochs, first built in epoch E > 1 "
                 "(a resumed run), gets the batches epoch 1 would build, for every task"),
        why=("fairseq builds a reusable epoch iterator's batches with numpy_seed(seed + epoch), so a run "
             "resumed in epoch E gets other batches than the uninterrupted run, and another model"),
        expected="get_batch_iterator(" + ", ".join(_GET_BATCH_ITERATOR_PARAMETERS) + ") and can_reuse_epoch_itr",
        guard=_resume_batches_guard,
        install=_install_resume_batches,
        active=lambda: _marked(FairseqTask.get_batch_iterator, "RESUME_BATCHES"),
        refuse=False,
    ),
    Patch(
        name="BF16_DEVICE",
        target="fairseq.dataclass.utils.override_module_args",
        changes=("when torch_xla is not installed, --bf16 no longer implies --tpu: the args' tpu flag "
                 "that fairseq.options set is cleared before they become the run's config"),
        why=("fairseq 0.12's option parser turns --bf16 into --tpu (fairseq issue #4696), so fairseq-train "
             "--bf16 on a GPU (or --cpu) fails looking for torch_xla's XLA device"),
        expected=("override_module_args(args), called by convert_namespace_to_omegaconf through its module "
                  "global, and parse_args_and_arch setting args.tpu = True for --bf16 (fairseq 0.12)"),
        guard=_bf16_device_guard,
        install=_install_bf16_device,
        active=_bf16_device_active,
        refuse=False,
    ),
    Patch(
        name="PREFETCH_EXIT",
        target="fairseq.data.iterators.BackgroundConsumer (the thread of BufferedIterator)",
        changes=("the prefetching thread fairseq starts for each epoch's batches can be stopped after the "
                 "batch it is making; at exit (atexit) every running one is stopped and waited for"),
        why=("the thread is a daemon making batches with torch ops that release the GIL: if a command ends "
             "while it makes one (fairseq-train stopping at --max-update mid-epoch), Python < 3.14 ends the "
             "thread inside torch's C++ as the op returns and the process aborts after a finished run "
             "('terminate called without an active exception', SIGABRT, exit status 134)"),
        expected=("a threading.Thread BackgroundConsumer(queue, source, max_len, cuda_device) that "
                  "BufferedIterator._create_consumer starts by its module global (fairseq 0.12)"),
        guard=_prefetch_exit_guard,
        install=_install_prefetch_exit,
        active=lambda: _marked(iterators.BackgroundConsumer, "PREFETCH_EXIT"),
        refuse=False,
    ),
)


def get_patch(name: str) -> Patch:
    """The patch called ``name`` (e.g. ``"SAFE_LOADER"``)."""
    for patch in PATCHES:
        if patch.name == name:
            return patch
    raise KeyError(f"no fairseq-rope patch {name!r}; patches: {', '.join(p.name for p in PATCHES)}")


def apply_patches(environ: Mapping[str, str] = os.environ) -> Tuple[str, ...]:
    """Apply every patch not opted out of in ``environ`` (idempotent); the active ones' names.

    Raises :class:`PatchError` if a refusing patch's target does not match.
    """
    for patch in PATCHES:
        if not patch.enabled(environ):
            logger.info("fairseq-rope patch %s not applied (%s is set)", patch.name, patch.opt_out)
        else:
            patch.apply()
    return applied_patches()


def applied_patches() -> Tuple[str, ...]:
    """Names of the patches active in this process, in :data:`PATCHES` order."""
    return tuple(patch.name for patch in PATCHES if patch.active())
