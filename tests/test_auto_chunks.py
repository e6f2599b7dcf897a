"""``--pipeline-chunks auto``: the parsing of ``auto``, and that the measurement before the
first update (chunking/auto_chunks.py) leaves the numbers exactly as an explicit K gives them
(the choice of K from the fitted costs: tests/test_chunk_choice.py)."""
import logging
from types import SimpleNamespace

import pytest
import torch

from fairseq_hybrid.errors import HybridConfigError
from fairseq_hybrid.parallel.placement import AUTO, resolved_chunks
from fairseq_hybrid.plugin.placement_options import chunks_of, parse_devices, placement_options
from fairseq_hybrid.chunking.chunk_choice import (
    choose_chunks,
)
from helpers import loss_and_grads, make_batch, make_dictionary, make_model, make_task, random_lengths, uniform_costs


def test_one_device_never_chunks():
    choice = choose_chunks(uniform_costs(2, 0.001, 0.001), 30, 30, (0, 0), "cycle")
    assert choice.chunks == 1
    # the options' count before anything is measured: None where the chooser decides
    for devices, chunks, planned in (("cpu", "auto", 1), ("cpu", 0, 1), ("cpu,cpu", 0, None),
                                     ("cpu,cpu", 3, 3)):
        options = placement_options(SimpleNamespace(hybrid_devices=devices, pipeline_chunks=chunks), (2, 2))
        assert options.chunks == chunks_of(chunks) and options.devices == parse_devices(devices)
        assert resolved_chunks(options) == planned


def test_pipeline_chunks_argument():
    from fairseq import options

    parser = options.get_training_parser()
    chunks_argument = parser._option_string_actions["--pipeline-chunks"].type  # the plugin's
    assert chunks_argument("auto") == 0 and chunks_argument("AUTO") == 0
    assert chunks_argument("4") == 4
    with pytest.raises(HybridConfigError, match=r"--pipeline-chunks 'four' is not allowed: an integer >= 1 .* or auto"):
        chunks_argument("four")


def test_fairseq_training_parser_accepts_auto():
    from fairseq import options

    # fairseq's own lstm: the option is fairseq's, and parsing checks no data directory
    for value, parsed in (("auto", 0), ("3", 3)):
        args = options.parse_args_and_arch(options.get_training_parser(),
                                           ["data", "--arch", "lstm", "--pipeline-chunks", value])
        assert args.pipeline_chunks == parsed


@pytest.mark.parametrize("options", [{}, {"input_feeding": True}, {"decoder_hidden_size": 24}],
                         ids=["plain", "input-feeding", "bridge"])
def test_auto_measures_chooses_logs_and_gives_the_numbers_of_that_k(caplog, options):
    dictionary = make_dictionary()
    model = make_model(dictionary, dtype=torch.float64, dropout=0.3, **options).train()
    batch = make_batch(dictionary, random_lengths(12, seed=4, max_len=14), seed=4)
    batch["ntokens"] = int(batch["target"].ne(dictionary.pad()).sum())
    from fairseq_hybrid.plugin.criterion import HybridCrossEntropyCriterion

    criterion = HybridCrossEntropyCriterion(make_task(dictionary), False, 0.1)
    try:
        torch.manual_seed(7)
        model.runtime.configure(devices=(torch.device("cpu"),) * 2, chunks=AUTO)
        with caplog.at_level(logging.INFO, logger="fairseq_hybrid"):
            auto = loss_and_grads(criterion, model, batch)
        after_auto = torch.get_rng_state()
        plan = model.runtime.engine.plan
        choice = model.runtime.choice
        assert choice is not None and plan.chunks == choice.chunks in choice.predicted_s
        assert choice.measured_s > 0 and choice.probes[0] == 1
        assert f"2 device(s), {plan.chunks} pipeline chunk(s) (auto)" in caplog.text
        assert "<- chosen" in caplog.text
        torch.manual_seed(7)
        model.runtime.configure(chunks=plan.chunks)
        explicit = loss_and_grads(criterion, model, batch)
        assert torch.equal(torch.get_rng_state(), after_auto)  # the measurement drew nothing
    finally:
        model.runtime.close()
    assert auto[0].item() == explicit[0].item()
    assert auto[3].keys() == explicit[3].keys()
    for name, grad in auto[3].items():
        assert torch.equal(grad, explicit[3][name]), name


@pytest.mark.slow  # end to end through fairseq-train
def test_fairseq_train_auto_equals_the_k_it_chose_update_for_update(sample_data, tmp_path):
    import re

    from cli import model_args, run_tool, train_args, train_losses

    data = sample_data  # conftest: binarized once per session

    def args(name, *chunks):
        return train_args(data / "bin", model_args(32, 2, "--dropout", "0.3"), "--hybrid-devices", "cpu,cpu",
                          "--max-update", "8", "--log-format", "json", "--log-interval", "1",
                          "--seed", "3", "--no-save", *chunks, save_dir=tmp_path / name)

    def train(name, *chunks):
        proc = run_tool("fairseq-train", args(name, *chunks), cwd=data)
        return proc.stdout + proc.stderr

    auto = train("auto", "--pipeline-chunks", "auto")
    match = re.search(r"2 device\(s\), (\d+) pipeline chunk\(s\) \(auto\)", auto)
    assert match, auto[-3000:]
    assert re.search(r"pipeline chunks: \d+, chosen by the performance model from [\d.]+ s", auto)
    explicit = train("explicit", "--pipeline-chunks", match.group(1))
    assert f"2 device(s), {match.group(1)} pipeline chunk(s)\n" in explicit
    losses = train_losses(auto)
    assert sorted(losses) == list(range(1, 9))
    assert losses == train_losses(explicit)
    # several devices and no --pipeline-chunks: auto is the default. fairseq-train's own
    # parser (the plugin's checks included) gives the run without the option exactly the
    # options of the auto run above, so that run is this one
    from fairseq import options

    def parsed(*chunks):
        return vars(options.parse_args_and_arch(options.get_training_parser(), args("same", *chunks)))

    assert parsed() == parsed("--pipeline-chunks", "auto")
    assert parsed()["pipeline_chunks"] != parsed("--pipeline-chunks", match.group(1))["pipeline_chunks"]


def test_the_measurement_leaves_gradients_and_random_state_alone():
    from fairseq_hybrid.chunking.auto_chunks import choose_for_batch

    dictionary = make_dictionary()
    model = make_model(dictionary, dtype=torch.float64, dropout=0.3).train()
    batch = make_batch(dictionary, random_lengths(6, seed=2, max_len=10), seed=2)
    for index, p in enumerate(model.parameters()):
        p.grad = torch.full_like(p, float(index))
    engine = model.runtime.build_engine(devices=(torch.device("cpu"),) * 2, chunks=1)  # the chooser measures with 1
    try:
        state = torch.get_rng_state()
        net = batch["net_input"]
        choice = choose_for_batch(model, engine.plan, engine.workers, net["src_tokens"], net["src_lengths"],
                                  net["prev_output_tokens"])
        assert torch.equal(torch.get_rng_state(), state)
    finally:
        model.runtime.close()
    assert choice.chunks in choice.predicted_s
    for index, p in enumerate(model.parameters()):
        assert torch.equal(p.grad, torch.full_like(p, float(index)))
