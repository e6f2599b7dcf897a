"""The one way the plugin's patches wrap ``FairseqTask.get_batch_iterator`` (for every
task and model): each patch gives a function that receives fairseq's original, the task, the
dataset and the call's arguments bound by name with their defaults, and returns the
iterator. A patch wraps once however often ``apply`` runs."""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Dict

from fairseq.tasks import FairseqTask

Around = Callable[[Callable[..., Any], Any, Any, Dict[str, Any]], Any]


def wrap_get_batch_iterator(marker: str, around: Around) -> None:
    """Wrap ``FairseqTask.get_batch_iterator`` with ``around`` unless a wrapper marked
    ``marker`` is already in place (``functools.wraps`` carries the marks outwards)."""
    original = FairseqTask.get_batch_iterator
    if getattr(original, marker, False):
        return
    signature = inspect.signature(original)

    @functools.wraps(original)
    def get_batch_iterator(self: Any, dataset: Any, *args: Any, **kwargs: Any) -> Any:
        call = signature.bind(self, dataset, *args, **kwargs)
        call.apply_defaults()
        return around(original, self, dataset, call.arguments)

    setattr(get_batch_iterator, marker, True)
    FairseqTask.get_batch_iterator = get_batch_iterator
