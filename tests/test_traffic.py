"""The transfer ledger (parallel/transfer.py) against the performance model's bytes
(planning/traffic.py): for 2 and 4 CPU devices x K = 1..4, what a real training step
records per (source, destination, phase) equals what the model charges, route by route."""
import pytest
import torch

from fairseq_hybrid.parallel.transfer import PHASES
from fairseq_hybrid.planning.traffic import StepShapes, step_traffic
from fairseq_hybrid.plugin.criterion import HybridCrossEntropyCriterion
from helpers import make_batch, make_dictionary, make_model, make_task, random_lengths


def by_phase(routes):
    return {phase for (_, _, phase), nbytes in routes.items() if nbytes}


def shapes_of(model, batch, dictionary) -> StepShapes:
    head = model.decoder.head
    tokens = batch["target"].ne(dictionary.pad()).sum(dim=1)
    return StepShapes(
        sentences=batch["target"].size(0),
        source_len=batch["net_input"]["src_tokens"].size(1),
        target_len=batch["target"].size(1),
        encoder_hidden=model.encoder.hidden_size,
        decoder_hidden=model.decoder.hidden_size,
        combined_dim=head.combined_dim,
        head_param_bytes=sum(p.numel() * p.element_size() for p in head.parameters()),
        bridge=model.decoder.has_bridge,
        tokens_per_sentence=tuple(int(n) for n in tokens),
    )


@pytest.mark.parametrize("devices", [2, 4])
@pytest.mark.parametrize("chunks", [1, 2, 3, 4])
def test_the_model_charges_exactly_what_a_real_step_copies(devices, chunks):
    dictionary = make_dictionary()
    # a bridge (hidden sizes differ) and dropout on the combined states: every route
    model = make_model(dictionary, dtype=torch.float32, encoder_layers=4, decoder_layers=4,
                       dropout=0.2).train()
    batch = make_batch(dictionary, random_lengths(7, seed=devices + chunks), seed=3)
    batch["ntokens"] = int(batch["target"].ne(dictionary.pad()).sum())
    criterion = HybridCrossEntropyCriterion(make_task(dictionary), False, 0.1)
    model.runtime.configure(devices=(torch.device("cpu"),) * devices, chunks=chunks)
    try:
        loss, _, _ = criterion(model, batch)
        loss.backward()
        recorded = model.runtime.engine.ledger.snapshot()
        plan = model.runtime.engine.plan
    finally:
        model.runtime.close()
    predicted = step_traffic(plan.layer_device, devices, shapes_of(model, batch, dictionary))
    assert recorded == predicted
    assert by_phase(recorded) == set(PHASES)  # every phase moved something


def test_one_device_moves_nothing_and_the_unsplit_head_only_takes_the_targets():
    dictionary = make_dictionary()
    model = make_model(dictionary, dtype=torch.float32, encoder_layers=2, decoder_layers=2)
    batch = make_batch(dictionary, random_lengths(5, seed=1), seed=1)
    batch["ntokens"] = int(batch["target"].ne(dictionary.pad()).sum())
    criterion = HybridCrossEntropyCriterion(make_task(dictionary), False, 0.1)
    # the head on one device is the master head's, the top layers' device: H and S stay
    # there, only the targets and the padding mask come from device 0
    for devices, split, expected_phases in ((1, True, set()),
                                            (2, False, {"pipeline_forward", "pipeline_backward",
                                                        "head_forward"})):
        model.runtime.configure(devices=(torch.device("cpu"),) * devices, chunks=2, split_head=split)
        try:
            criterion(model, batch)[0].backward()
            recorded = model.runtime.engine.ledger.snapshot()
            plan = model.runtime.engine.plan
        finally:
            model.runtime.close()
        shapes = shapes_of(model, batch, dictionary)
        assert recorded == step_traffic(plan.layer_device, plan.num_devices, shapes, split_head=split)
        assert by_phase(recorded) == expected_phases
