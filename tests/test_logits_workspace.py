"""The reusable logits buffer (fairseq_hybrid/model/logits_workspace.py): reused after a
backward, never lent twice, one per thread, and the loss's numbers unchanged by it."""
import threading

import torch

from fairseq_hybrid.model import logits_workspace
from fairseq_hybrid.model.loss import projected_token_loss


def loss_and_grads(layer, features, target):
    features = features.detach().requires_grad_(True)
    layer.zero_grad()
    loss = projected_token_loss(layer, features, target, 0.1, False)[0]
    loss.backward()
    return loss.detach(), features.grad, layer.weight.grad.clone()


def reference(layer, features, target):
    """fairseq's label-smoothed loss written out through autograd (no buffer)."""
    features = features.detach().requires_grad_(True)
    layer.zero_grad()
    lprobs = torch.log_softmax(layer(features), -1)
    eps_i = 0.1 / (lprobs.size(-1) - 1)
    loss = (1 - 0.1 - eps_i) * -lprobs.gather(1, target[:, None]).sum() + eps_i * -lprobs.sum()
    loss.backward()
    return loss.detach(), features.grad, layer.weight.grad.clone()


def test_the_buffer_is_reused_after_backward_and_numbers_match():
    torch.manual_seed(0)
    layer = torch.nn.Linear(8, 50)
    features, target = torch.randn(12, 8), torch.randint(0, 50, (12,))
    first, lease = logits_workspace.borrow(12, 50, features)
    assert lease is not None
    lease.give_back()
    for _ in range(2):
        got = loss_and_grads(layer, features, target)
        for a, b in zip(got, reference(layer, features, target)):
            torch.testing.assert_close(a, b)
    again, lease = logits_workspace.borrow(12, 50, features)
    assert again.data_ptr() == first.data_ptr()  # the same memory, step after step
    lease.give_back()


def test_a_lent_buffer_is_never_lent_again_before_its_backward():
    torch.manual_seed(1)
    layer = torch.nn.Linear(8, 30)
    a_in, b_in = torch.randn(5, 8, requires_grad=True), torch.randn(5, 8, requires_grad=True)
    target = torch.randint(0, 30, (5,))
    loss_a = projected_token_loss(layer, a_in, target, 0.1, False)[0]
    loss_b = projected_token_loss(layer, b_in, target, 0.1, False)[0]  # a's buffer still lent
    (loss_a + loss_b).backward()
    for features, grad in ((a_in, a_in.grad), (b_in, b_in.grad)):
        torch.testing.assert_close(grad, reference(layer, features, target)[1])


def test_a_dropped_graph_returns_the_buffer():
    layer = torch.nn.Linear(4, 9)
    features = torch.randn(3, 4, requires_grad=True)
    loss = projected_token_loss(layer, features, torch.tensor([1, 2, 3]), 0.1, False)[0]
    assert logits_workspace.borrow(3, 9, features) == (None, None)
    del loss  # the graph (and the lease on its context) is gone: no backward will come
    out, lease = logits_workspace.borrow(3, 9, features)
    assert lease is not None


def test_each_thread_has_its_own_buffer():
    features = torch.randn(4, 4)
    here, lease = logits_workspace.borrow(4, 6, features)
    other = {}

    def borrow_there():
        other["out"], other["lease"] = logits_workspace.borrow(4, 6, features)

    thread = threading.Thread(target=borrow_there)
    thread.start()
    thread.join()
    assert other["lease"] is not None and other["out"].data_ptr() != here.data_ptr()
    lease.give_back()
