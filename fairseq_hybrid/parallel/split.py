"""The one even split: ``total`` items into ``parts`` contiguous runs as equal as possible
(the first ``total % parts`` one longer). Layers over devices, time steps into chunks,
sentences into head shards all use it."""
from __future__ import annotations

from typing import List, Sequence, Tuple

Span = Tuple[int, int]  # [start, end)


def even_sizes(total: int, parts: int) -> List[int]:
    base, extra = divmod(total, parts)
    return [base + (1 if index < extra else 0) for index in range(parts)]


def spans(sizes: Sequence[int]) -> List[Span]:
    """Consecutive [start, end) ranges of the given sizes, from 0."""
    result, start = [], 0
    for size in sizes:
        result.append((start, start + size))
        start += size
    return result
