"""fairseq's own ``--arch lstm`` and ``hybrid_lstm --input-feeding`` are one network: fairseq
lstm's weights mapped by ``tools/from_fairseq_lstm.py`` give the same logits, loss and
gradients (float64, dropout 0), the same beam search, and with dropout, fed one set of masks,
the same numbers again; the mapping round-trips, refuses what it cannot map, and its command
line writes a checkpoint fairseq-generate translates with exactly as with the lstm's."""
import argparse
import re
import sys
from typing import Dict, List

import pytest
import torch
from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion
from fairseq.models.lstm import LSTMModel
from fairseq.sequence_generator import SequenceGenerator
from torch.nn.utils.rnn import pack_padded_sequence
from torch.utils._python_dispatch import TorchDispatchMode

from cli import USER_DIR, hypotheses, run_tool
from helpers import make_batch, make_dictionary, make_task, random_lengths
from fairseq_hybrid.errors import HybridConfigError
from fairseq_hybrid.plugin.config import HybridLSTMConfig
from fairseq_hybrid.plugin.criterion import HybridCrossEntropyCriterion
from fairseq_hybrid.plugin.hybrid_lstm import HybridLSTMModel
from fairseq_hybrid.tools.from_fairseq_lstm import (
    hybrid_options, hybrid_to_lstm, lstm_to_hybrid, main,
)

pytestmark = pytest.mark.usefixtures("full_precision_reference")  # float64 log-softmax
# float64 agreement: fairseq's AttentionLayer rounds the attention scores to float32 (its fp16
# cast) before the softmax; that alone makes the two differ by ~3e-10 (measured, logits of
# magnitude ~1). Not swapping W_c's column blocks changes the logits by ~1.
ATOL = 1e-8
BEAM_ATOL = 1e-6  # SequenceGenerator keeps scores and attention in float32 (ulp 1.2e-7 at 1)
LAYERS = 3
CONFIGS = {
    # separate output layer with bias; encoder hidden size != decoder's (the bridge layers)
    "separate": dict(encoder_embed_dim=10, encoder_hidden_size=16, decoder_embed_dim=8,
                     decoder_hidden_size=12, decoder_out_embed_dim=12),
    # --share-all-embeddings: the output layer is the (one) embedding matrix
    "shared": dict(encoder_embed_dim=12, encoder_hidden_size=12, decoder_embed_dim=12,
                   decoder_hidden_size=12, decoder_out_embed_dim=12, share_all_embeddings=True),
}
DROPOUTS = dict(encoder_dropout_in=0.2, encoder_dropout_out=0.3, decoder_dropout_in=0.25,
                decoder_dropout_out=0.35)


def lstm_args(config: str, **extra) -> argparse.Namespace:
    return argparse.Namespace(arch="lstm", criterion="label_smoothed_cross_entropy", dropout=0.0,
                              encoder_layers=LAYERS, decoder_layers=LAYERS,
                              max_source_positions=1024, max_target_positions=1024,
                              **CONFIGS[config], **extra)


def build_pair(args: argparse.Namespace, dictionary, seed: int = 0):
    """fairseq's LSTMModel with weights drawn in [-0.5, 0.5] (larger than its initialisation,
    so attention and output are far from uniform), and hybrid_lstm built from
    ``hybrid_options`` with the mapped weights; float64, train mode."""
    task = make_task(dictionary)
    torch.manual_seed(seed)
    lstm = LSTMModel.build_model(argparse.Namespace(**vars(args)), task).double()
    with torch.no_grad():
        for param in lstm.parameters():
            param.uniform_(-0.5, 0.5)
        lstm.encoder.embed_tokens.weight[dictionary.pad()] = 0
        lstm.decoder.embed_tokens.weight[dictionary.pad()] = 0
    hybrid = HybridLSTMModel.build_model(HybridLSTMConfig(**hybrid_options(args)), task).double()
    hybrid.load_state_dict(lstm_to_hybrid(lstm.state_dict(), args))
    return lstm.train(), hybrid.train()


def padded_batch(dictionary, seed: int = 3) -> dict:
    """Seven sentence pairs of lengths 2..9, sorted and padded as fairseq collates them."""
    batch = make_batch(dictionary, random_lengths(7, seed=seed), seed=seed)
    batch["ntokens"] = int(batch["target"].ne(dictionary.pad()).sum())
    assert batch["net_input"]["src_tokens"].eq(dictionary.pad()).any()  # padding on both sides
    assert batch["target"].eq(dictionary.pad()).any()
    return batch


def logits_loss_grads(model, criterion, batch):
    """The logits of one forward pass, then the loss and every parameter's gradient (by
    state-dict name, tied names included) of one training step through ``criterion``."""
    logits = model(**batch["net_input"])[0]
    model.zero_grad()
    loss, _, _ = criterion(model, batch)
    loss.backward()
    grads = {name: p.grad for name, p in model.state_dict(keep_vars=True).items()}
    assert all(g is not None for g in grads.values())
    return logits.detach(), loss.detach(), grads


def assert_same_step(lstm_step, hybrid_step, args) -> None:
    (lstm_logits, lstm_loss, lstm_grads), (logits, loss, grads) = lstm_step, hybrid_step
    torch.testing.assert_close(logits, lstm_logits, rtol=0, atol=ATOL)
    torch.testing.assert_close(loss, lstm_loss, rtol=1e-12, atol=ATOL)
    mapped = hybrid_to_lstm(grads, hybrid_options(args))  # hybrid's gradients, in lstm's names
    assert mapped.keys() == lstm_grads.keys()
    for name, grad in lstm_grads.items():
        torch.testing.assert_close(mapped[name], grad, rtol=0, atol=ATOL,
                                   msg=lambda m, name=name: f"gradient of {name}: {m}")


def criteria(dictionary):
    task = make_task(dictionary)
    return (LabelSmoothedCrossEntropyCriterion(task, False, 0.1),
            HybridCrossEntropyCriterion(task, False, 0.1))  # the hybrid model's training path


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_same_logits_loss_and_gradients_without_dropout(config):
    dictionary, args = make_dictionary(), lstm_args(config)
    lstm, hybrid = build_pair(args, dictionary)
    batch = padded_batch(dictionary)
    lstm_criterion, hybrid_criterion = criteria(dictionary)
    assert_same_step(logits_loss_grads(lstm, lstm_criterion, batch),
                     logits_loss_grads(hybrid, hybrid_criterion, batch), args)


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_same_beam_search(config):
    """fairseq's SequenceGenerator (fairseq-generate's beam search) finds the same hypotheses
    with the same scores. Attention is reported in other positions: fairseq's lstm in its
    right-padded source layout, hybrid_lstm in the caller's (left-padded) positions."""
    dictionary, args = make_dictionary(), lstm_args(config)
    lstm, hybrid = (model.eval() for model in build_pair(args, dictionary, seed=1))
    batch = padded_batch(dictionary, seed=4)
    found = []
    for model in (lstm, hybrid):
        generator = SequenceGenerator([model], dictionary, beam_size=4, max_len_b=12)
        with torch.no_grad():
            found.append(generator.generate([model], batch))
    pads = batch["net_input"]["src_tokens"].eq(dictionary.pad()).sum(dim=1)
    for sentence, (lstm_hypos, hybrid_hypos) in enumerate(zip(*found)):
        assert len(lstm_hypos) == len(hybrid_hypos) == 4
        for ref, hyp in zip(lstm_hypos, hybrid_hypos):
            assert torch.equal(hyp["tokens"], ref["tokens"])
            torch.testing.assert_close(hyp["score"], ref["score"], rtol=0, atol=BEAM_ATOL)
            torch.testing.assert_close(hyp["positional_scores"], ref["positional_scores"],
                                       rtol=0, atol=BEAM_ATOL)
            in_caller_positions = ref["attention"].roll(int(pads[sentence]), dims=0)
            torch.testing.assert_close(hyp["attention"], in_caller_positions, rtol=0,
                                       atol=BEAM_ATOL)
    assert len({tuple(hypos[0]["tokens"].tolist()) for hypos in found[0]}) > 1  # not one output


# ------------------------------------------------------------------ one set of dropout masks
RANDOM_OPS = ("rand", "bernoulli", "normal", "uniform", "dropout", "multinomial", "exponential")


class ScriptedDraws(TorchDispatchMode):
    """Every random draw of a forward pass served, in order, from ``uniforms``: a
    ``torch.rand`` (hybrid_lstm draws its masks as uniforms < 1 - p) gets the next uniforms,
    a ``Tensor.bernoulli_(1 - p)`` (what F.dropout and nn.LSTM's dropout do on the CPU:
    fairseq's lstm) the next uniforms < 1 - p. So element e is kept in both models exactly
    when its uniform is below the keep probability. Any other random op fails."""

    def __init__(self, uniforms: List[torch.Tensor]) -> None:
        super().__init__()
        self.pending = list(uniforms)

    def next(self, shape) -> torch.Tensor:
        assert self.pending, "more random draws than scripted"
        uniform = self.pending.pop(0)
        assert tuple(uniform.shape) == tuple(shape), f"draw of {tuple(shape)}, scripted {tuple(uniform.shape)}"
        return uniform.clone()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten.rand.default:
            return self.next(args[0]).to(dtype=kwargs.get("dtype") or torch.get_default_dtype(),
                                         device=kwargs.get("device"))
        if func is torch.ops.aten.bernoulli_.float:
            target, keep = args
            return target.copy_(self.next(target.shape).lt(keep))
        assert not any(word in func.__name__ for word in RANDOM_OPS), f"unscripted draw {func}"
        return func(*args, **kwargs)

    def __exit__(self, *exc):
        super().__exit__(*exc)
        assert exc[0] is not None or not self.pending, f"{len(self.pending)} scripted draws unused"


def site_uniforms(batch, args, seed: int = 5) -> Dict[str, object]:
    """One uniform per element of every dropout site of a forward pass, by site."""
    generator = torch.Generator().manual_seed(seed)
    B, S = batch["net_input"]["src_tokens"].shape
    T = batch["net_input"]["prev_output_tokens"].size(1)
    enc, dec = args.encoder_hidden_size, args.decoder_hidden_size

    def u(*shape):
        return torch.rand(shape, generator=generator)

    return dict(
        encoder_embeddings=u(B, S, args.encoder_embed_dim),  # right-padded, batch-major
        encoder_between=[u(S, B, enc) for _ in range(LAYERS - 1)],  # into layers 1..L-1
        encoder_top=u(S, B, enc),  # the states S attended over
        decoder_embeddings=u(B, T, args.decoder_embed_dim),
        decoder_between=[[u(B, dec) for _ in range(LAYERS - 1)] for _ in range(T)],  # per step
        decoder_out=[u(B, dec) for _ in range(T)],  # H_c, per step
    )


def lstm_draws(sites, batch) -> List[torch.Tensor]:
    """In fairseq lstm's order and layouts: nn.LSTM drops its packed data between layers; each
    decoder step drops every layer's output (the top one's unused) then the attention's."""
    lengths = batch["net_input"]["src_lengths"]
    draws = [sites["encoder_embeddings"],
             *(pack_padded_sequence(u, lengths).data for u in sites["encoder_between"]),
             sites["encoder_top"], sites["decoder_embeddings"]]
    for between, out in zip(sites["decoder_between"], sites["decoder_out"]):
        draws += [*between, torch.rand(out.shape), out]
    return draws


def hybrid_draws(sites) -> List[torch.Tensor]:
    """In hybrid_lstm's order (``HybridLSTMNetwork.draw_step``, then step by step) and layouts."""
    draws = [sites["encoder_embeddings"].transpose(0, 1), *sites["encoder_between"],
             sites["encoder_top"], sites["decoder_embeddings"]]
    for between, out in zip(sites["decoder_between"], sites["decoder_out"]):
        draws += [*(u.unsqueeze(0) for u in between), out.unsqueeze(1)]
    return draws


def scripted_step(model, criterion, batch, draws):
    """``logits_loss_grads`` with every draw of both forward passes served from ``draws``
    (hybrid_lstm's criterion calls the model's forward, which calls it again for the features)."""
    forward, depth = model.forward, []

    def scripted_forward(*args, **kwargs):
        if depth:
            return forward(*args, **kwargs)
        depth.append(1)
        try:
            with ScriptedDraws(draws):
                return forward(*args, **kwargs)
        finally:
            depth.pop()

    model.forward = scripted_forward
    try:
        return logits_loss_grads(model, criterion, batch)
    finally:
        del model.forward


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_same_numbers_with_dropout_fed_one_set_of_masks(config):
    dictionary, args = make_dictionary(), lstm_args(config, **DROPOUTS)
    lstm, hybrid = build_pair(args, dictionary)
    batch = padded_batch(dictionary)
    sites = site_uniforms(batch, args)
    lstm_criterion, hybrid_criterion = criteria(dictionary)
    lstm_step = scripted_step(lstm, lstm_criterion, batch, lstm_draws(sites, batch))
    assert_same_step(lstm_step, scripted_step(hybrid, hybrid_criterion, batch,
                                              hybrid_draws(sites)), args)
    with torch.no_grad():  # and the masks did drop something
        undropped = lstm.eval()(**batch["net_input"])[0]
    assert (undropped - lstm_step[0]).abs().max() > 0.1


# ------------------------------------------------------------------ the mapping itself
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_mapping_round_trips(config):
    dictionary, args = make_dictionary(), lstm_args(config)
    lstm, hybrid = build_pair(args, dictionary)
    original = lstm.state_dict()
    back = hybrid_to_lstm(lstm_to_hybrid(original, args), hybrid_options(args))
    assert back.keys() == original.keys()
    assert all(torch.equal(back[name], tensor) for name, tensor in original.items())
    hybrid_state = hybrid.state_dict()
    again = lstm_to_hybrid(hybrid_to_lstm(hybrid_state, hybrid_options(args)), args)
    assert again.keys() == hybrid_state.keys()
    assert all(torch.equal(again[name], tensor) for name, tensor in hybrid_state.items())


@pytest.mark.parametrize("change, message", [
    (dict(encoder_bidirectional=True), "fairseq lstm --encoder-bidirectional True cannot be "
                                       "mapped: hybrid_lstm's encoder is unidirectional"),
    (dict(decoder_attention="0"), "--decoder-attention '0' cannot be mapped: hybrid_lstm always attends"),
    (dict(decoder_out_embed_dim=7), "--decoder-out-embed-dim 7 cannot be mapped: only "
                                    "--decoder-hidden-size (12) is"),
    (dict(criterion="adaptive_loss"), "--criterion 'adaptive_loss' cannot be mapped"),
    (dict(decoder_layers=2), "--decoder-layers 2 cannot be mapped: only --encoder-layers (3) is"),
])
def test_lstm_configurations_of_another_network_are_refused(change, message):
    args = argparse.Namespace(**{**vars(lstm_args("separate")), **change})
    with pytest.raises(HybridConfigError, match="^fairseq_hybrid: error: .*" + re.escape(message)) as raised:
        lstm_to_hybrid({}, args)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("change, message", [
    (dict(input_feeding=False), "hybrid_lstm --input-feeding False cannot be mapped"),
    (dict(decoder_out_embed_dim=7), r"--decoder-out-embed-dim 7 cannot be mapped: only "
                                    r"--decoder-hidden-size \(12\) is"),
])
def test_hybrid_configurations_without_a_fairseq_lstm_are_refused(change, message):
    options = {**hybrid_options(lstm_args("separate")), **change}
    with pytest.raises(HybridConfigError, match=message):
        hybrid_to_lstm({}, options)


def test_a_state_dict_of_other_options_is_refused_naming_the_keys():
    dictionary, args = make_dictionary(), lstm_args("separate")
    lstm, _ = build_pair(args, dictionary)
    fewer_layers = argparse.Namespace(**{**vars(args), "encoder_layers": 2, "decoder_layers": 2})
    with pytest.raises(HybridConfigError, match=r"not a fairseq lstm's with these options: "
                                                r"missing \[\], unexpected \['encoder.lstm.weight_ih_l2'"):
        lstm_to_hybrid(lstm.state_dict(), fewer_layers)


# ------------------------------------------------------------------ the command line
def scored_hypotheses(stdout: str) -> List[tuple]:
    """(sentence id, score, tokens) of fairseq-generate's H- lines, by sentence id."""
    rows = [line.split("\t") for line in hypotheses(stdout)]
    return sorted((row[0], float(row[1]), row[2] if len(row) > 2 else "") for row in rows)


@pytest.mark.slow
def test_converted_checkpoint_translates_as_the_lstm_checkpoint(sample_data, tmp_path, monkeypatch):
    """A checkpoint fairseq-train wrote for --arch lstm (its weights then redrawn in
    [-0.5, 0.5], so that it translates into long and varied sentences, as a short training
    cannot), converted by the command line: fairseq-generate (float32, beam 4) prints the
    same translations with the same scores."""
    from fairseq_cli import train

    monkeypatch.setattr(sys, "argv", [
        "fairseq-train", str(sample_data / "bin"), "--arch", "lstm", "--encoder-layers", "2",
        "--decoder-layers", "2", "--encoder-embed-dim", "24", "--encoder-hidden-size", "32",
        "--decoder-embed-dim", "24", "--decoder-hidden-size", "24", "--decoder-out-embed-dim",
        "24", "--optimizer", "adam", "--lr", "0.01", "--max-tokens", "300", "--max-update", "1",
        "--save-dir", str(tmp_path), "--no-epoch-checkpoints", "--disable-validation",
        "--num-workers", "0"])
    train.cli_main()
    lstm_checkpoint = tmp_path / "checkpoint_last.pt"
    state = torch.load(lstm_checkpoint, weights_only=False)
    generator = torch.Generator().manual_seed(0)
    for name, weight in state["model"].items():
        weight.copy_(torch.rand(weight.shape, generator=generator) - 0.5)
        if "embed_tokens" in name:
            weight[1] = 0  # the padding row
    torch.save(state, lstm_checkpoint)
    converted = tmp_path / "hybrid.pt"
    run_tool("python", ["-m", "fairseq_hybrid.tools.from_fairseq_lstm", str(lstm_checkpoint),
                        str(converted)], cwd=tmp_path)
    generated = [
        scored_hypotheses(run_tool("fairseq-generate", [
            str(sample_data / "bin"), "--path", str(path), "--beam", "4", "--batch-size", "8",
            "--gen-subset", "test", "--max-len-b", "15", "--user-dir", USER_DIR],
            cwd=tmp_path).stdout)
        for path in (lstm_checkpoint, converted)]
    assert len(generated[0]) == 20  # every test sentence
    assert [(i, words) for i, _, words in generated[1]] == [(i, words) for i, _, words in generated[0]]
    for (_, lstm_score, _), (_, score, _) in zip(*generated):
        assert score == pytest.approx(lstm_score, abs=2e-4)  # printed to 4 decimals


def test_command_line_refuses_what_is_not_a_fairseq_lstm_checkpoint(tmp_path):
    """One line, before anything is written: a missing file, a checkpoint of another model."""
    with pytest.raises(HybridConfigError, match=r"IN '.*missing.pt' is not a file"):
        main([str(tmp_path / "missing.pt"), str(tmp_path / "out.pt")])
    dictionary = make_dictionary()
    model = HybridLSTMModel.build_model(
        HybridLSTMConfig(**hybrid_options(lstm_args("separate"))), make_task(dictionary))
    other = tmp_path / "hybrid.pt"
    torch.save({"cfg": {"model": {"_name": "hybrid_lstm"}}, "model": model.state_dict(),
                "optimizer_history": [{"criterion_name": "x", "optimizer_name": "x",
                                       "lr_scheduler_state": {}, "num_updates": 0}],
                "extra_state": {"train_iterator": {}}}, other)
    with pytest.raises(HybridConfigError, match="is a checkpoint of --arch hybrid_lstm, not of "
                                                "fairseq's lstm"):
        main([str(other), str(tmp_path / "out.pt")])
    with pytest.raises(HybridConfigError, match=r"OUT '.*hybrid.pt' is IN: give another file"):
        main([str(other), str(other)])
    with pytest.raises(HybridConfigError, match=r"OUT '.*no/out.pt' is not in an existing folder"):
        main([str(other), str(tmp_path / "no" / "out.pt")])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hybrid.pt"]
