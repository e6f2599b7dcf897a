"""Tests of fairseq_hybrid/model/dropout.py."""
import pytest
import torch

from fairseq_hybrid.model.dropout import MaskQueue, resolve


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_dropout_mask_is_a_scaled_bernoulli_keep_mask(dtype):
    """Every entry is 0 or 1 / (1 - p), kept with probability 1 - p (within 5 standard
    deviations of the binomial count), in the dtype asked for; off in eval mode."""
    from fairseq.modules import FairseqDropout

    from fairseq_hybrid.model.dropout import dropout_mask, dropped_out

    p, n = 0.3, 400_000
    dropout = FairseqDropout(p).train()
    torch.manual_seed(0)
    mask = dropout_mask(dropout, (n,), torch.empty(0, dtype=dtype))
    assert mask.dtype == dtype and mask.shape == (n,)
    kept = mask != 0
    assert torch.all(mask[kept] == torch.tensor(1 / (1 - p), dtype=dtype))
    expected, sd = n * (1 - p), (n * p * (1 - p)) ** 0.5
    assert abs(int(kept.sum()) - expected) < 5 * sd
    x = torch.randn(3, 4).to(dtype)
    assert dropout_mask(dropout.eval(), (n,), x) is None
    assert dropped_out(dropout, x) is x


def test_masks_are_drawn_in_queue_order_whoever_asks_first():
    queue, order = MaskQueue(), []

    def draw(name):
        def run():
            order.append(name)
            return torch.full((1,), float(len(order)))
        return run

    first, second, third = (queue.add(draw(name)) for name in ("a", "b", "c"))
    assert float(resolve(third)) == 3.0 and order == ["a", "b", "c"]
    assert float(resolve(first)) == 1.0 and float(resolve(second)) == 2.0  # drawn once
    assert order == ["a", "b", "c"] and not queue.draw_next()
    assert resolve(None) is None and float(resolve(torch.ones(1))) == 1.0


def test_a_mask_whose_draw_failed_raises_instead_of_waiting_forever():
    queue = MaskQueue()

    def fail():
        raise MemoryError("no room for the mask")

    broken, after = queue.add(fail), queue.add(lambda: torch.zeros(1))
    with pytest.raises(MemoryError):
        resolve(after)
    with pytest.raises(RuntimeError, match="never drawn"):
        resolve(broken)
    assert float(resolve(after)) == 0.0
