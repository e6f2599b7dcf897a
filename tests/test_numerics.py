"""Numerics through fairseq's own training loop: a NaN injected into the head is caught
(fairseq's FloatingPointError, with its NaN detector naming the module; the plugin's one
line), never trained on; gradient clipping sees the gradients of every device."""
import sys

import pytest
import torch
from fairseq_cli import train as fairseq_train

from cli import USER_DIR, prepared_sample


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return prepared_sample(tmp_path_factory.mktemp("numerics"), train=150, valid=10, test=10)


def train_in_process(monkeypatch, data, save_dir, *extra):
    monkeypatch.setattr(sys, "argv", [
        "fairseq-train", str(data / "bin"), "--user-dir", USER_DIR, "--arch", "hybrid_lstm",
        "--encoder-embed-dim", "16", "--encoder-hidden-size", "16", "--decoder-embed-dim", "16",
        "--decoder-hidden-size", "16", "--decoder-out-embed-dim", "16",
        "--hybrid-devices", "cpu,cpu", "--criterion", "hybrid_cross_entropy",
        "--optimizer", "adam", "--lr", "0.003", "--max-tokens", "300", "--max-update", "4",
        "--save-dir", str(save_dir), "--num-workers", "0", "--disable-validation",
        "--no-epoch-checkpoints", "--seed", "2", *extra,
    ])
    fairseq_train.cli_main()


def test_nan_in_the_head_stops_training_before_any_update(monkeypatch, data, tmp_path):
    from fairseq_hybrid.model import loss as head_loss

    real_loss = head_loss.projected_token_loss
    calls = {"n": 0}

    def loss_with_nan(output_proj, features, *args):
        calls["n"] += 1
        if calls["n"] >= 3:  # from the second update on (one call per shard)
            features = features + float("nan")
        return real_loss(output_proj, features, *args)

    monkeypatch.setattr(head_loss, "projected_token_loss", loss_with_nan)
    # fairseq's FloatingPointError, as the command line's one line (issue 23)
    with pytest.raises(SystemExit, match=r"training stopped at update 2: .*Nan/Inf.*no "
                                         r"checkpoint_last.pt had been written yet"):
        train_in_process(monkeypatch, data, tmp_path / "nan")
    assert not (tmp_path / "nan" / "checkpoint_last.pt").exists()


def test_clip_norm_covers_parameters_on_every_device(monkeypatch, data, tmp_path):
    """--clip-norm: fairseq's clip_grad_norm_ sees every parameter (on every device) and
    the logged gnorm is the norm over all of them; with a tiny max norm every update is
    clipped."""
    from fairseq import utils

    norms = []
    real = utils.clip_grad_norm_

    def spy(params, max_norm, aggregate_norm_fn=None):
        params = list(params)
        norms.append((len(params), real(params, max_norm, aggregate_norm_fn)))
        grads = [p.grad for p in params if p.grad is not None]
        assert torch.norm(torch.stack([g.norm() for g in grads])) <= max_norm * 1.0001
        return norms[-1][1]

    monkeypatch.setattr(utils, "clip_grad_norm_", spy)
    train_in_process(monkeypatch, data, tmp_path / "clip", "--clip-norm", "0.01")
    # one call per update, over all 22 parameter tensors of the 2+2-layer model (both
    # devices' layers, embeddings, head), each time with a norm above the limit
    assert [count for count, _ in norms] == [22] * 4
    assert all(norm > 0.01 for _, norm in norms)
