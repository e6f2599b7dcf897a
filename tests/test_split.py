"""Tests of fairseq_hybrid/parallel/split.py."""
from fairseq_hybrid.parallel.split import even_sizes, spans


def test_the_even_split_is_contiguous_and_near_equal():
    assert even_sizes(7, 3) == [3, 2, 2] and even_sizes(2, 4) == [1, 1, 0, 0]
    assert spans([3, 2, 0, 2]) == [(0, 3), (3, 5), (5, 5), (5, 7)]
