"""Two fixes to fairseq that make a killed training run resume exactly; installed on import.

fairseq resumes from ``checkpoint_last.pt`` with the model, optimizer and lr
schedule state and the position in the epoch, and reseeds torch before every
update (``seed + num_updates``), so dropout masks do not depend on when the
process started. Two things still broke a resume:

1. **A truncated checkpoint_last.pt.** fairseq writes the first file of a save
   atomically (``NAME.tmp``, then rename) but makes the others,
   ``checkpoint_last.pt`` and ``checkpoint_best.pt`` among them, with
   ``PathManager.copy``: on local disks a plain ``shutil.copyfile``. A kill
   during that copy leaves a truncated ``checkpoint_last.pt`` that every later
   resume fails to load. Local copies now go through
   :func:`fairseq_rope.base.atomic_path` (a temporary file renamed over the
   target), so a kill leaves the previous, complete checkpoint.

2. **Other batches after a resume.** fairseq (main, which fairseq-fixed
   0.12.3.1 is) groups sentences into batches once, when the epoch iterator is
   first built, with ``numpy_seed(seed + epoch)``, and then reuses those
   batches in every epoch (only their order is reshuffled per epoch). An
   uninterrupted run builds them in epoch 1; a run resumed in epoch E built
   them with ``seed + E``: other batches from then on, and a different model.
   :func:`~fairseq.tasks.FairseqTask.get_batch_iterator` now builds reusable
   iterators' batches as in epoch 1. Iterators rebuilt every epoch (sharded
   data, ``rebuild_batches`` tasks) already agree between the two runs and are
   left alone.

With both, a run SIGKILLed at any point and rerun unchanged ends, on CPU, with
the same bits as a run never interrupted (``tests/test_resume.py``).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from fairseq.file_io import PathManager
from fairseq.tasks import FairseqTask

from fairseq_rope import base

_PATCHED = "_fairseq_rope_resume"


def make_checkpoint_copies_atomic() -> None:
    """Wrap ``PathManager.copy`` so that local copies replace their target atomically."""
    copy = PathManager.copy
    if getattr(copy, _PATCHED, False):
        return

    @functools.wraps(copy)
    def atomic_copy(src_path: str, dst_path: str, overwrite: bool = False) -> bool:
        if PathManager.path_requires_pathmanager(dst_path):  # remote storage: fairseq's own way
            return copy(src_path, dst_path, overwrite=overwrite)
        with base.atomic_path(dst_path) as tmp:
            copy(src_path, str(tmp), overwrite=True)
        return True

    setattr(atomic_copy, _PATCHED, True)
    PathManager.copy = staticmethod(atomic_copy)  # type: ignore[method-assign]


def build_batches_as_in_epoch_one() -> None:
    """Wrap ``FairseqTask.get_batch_iterator`` so that a reusable iterator's batches do not depend on
    the epoch it is first built in (see the module docstring)."""
    get_batch_iterator: Callable[..., Any] = FairseqTask.get_batch_iterator
    if getattr(get_batch_iterator, _PATCHED, False):
        return

    @functools.wraps(get_batch_iterator)
    def wrapper(self: FairseqTask, dataset: Any, *args: Any, **kwargs: Any) -> Any:
        epoch = kwargs.get("epoch", 1)
        reused_across_epochs = (
            not kwargs.get("disable_iterator_cache", False)
            and not kwargs.get("update_epoch_batch_itr", False)
            and not getattr(self.cfg, "rebuild_batches", False)
            and self.can_reuse_epoch_itr(dataset)
        )
        if args or epoch == 1 or not reused_across_epochs or dataset in self.dataset_to_epoch_iter:
            return get_batch_iterator(self, dataset, *args, **kwargs)  # (fairseq's callers pass keywords)
        # Batches as an uninterrupted run made them in epoch 1; then the two
        # other uses of ``epoch`` in fairseq's method: the iterator's current
        # epoch and the dataset's.
        itr = get_batch_iterator(self, dataset, **{**kwargs, "epoch": 1})
        itr.epoch = epoch
        if hasattr(dataset, "set_epoch"):
            dataset.set_epoch(epoch)
        return itr

    setattr(wrapper, _PATCHED, True)
    FairseqTask.get_batch_iterator = wrapper  # type: ignore[method-assign]


make_checkpoint_copies_atomic()
build_batches_as_in_epoch_one()
