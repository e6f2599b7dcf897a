"""Tests of fairseq_hybrid/planning/sizes.py."""
import pytest

from fairseq_hybrid.model.presets import preset_values
from fairseq_hybrid.planning.sizes import BENCHMARK_PRESETS, BatchSize, ModelSize, layer_map


def test_batch_tokens_and_the_decoders_size():
    batch = BatchSize(6, 7, 5)
    assert (batch.source_tokens, batch.target_tokens) == (42, 30)
    same = ModelSize(2, 16, 8, 100)
    assert same.decoder_size == 16 and not same.has_bridge
    bridged = ModelSize(2, 16, 8, 100, decoder_hidden=12)
    assert bridged.decoder_size == 12 and bridged.has_bridge
    assert not ModelSize(2, 16, 8, 100, decoder_hidden=16).has_bridge


@pytest.mark.parametrize("name", sorted(BENCHMARK_PRESETS))
def test_a_benchmark_presets_model_has_its_architecture_presets_sizes(name):
    preset = BENCHMARK_PRESETS[name]
    values = preset_values(preset.arch)
    model = preset.model
    assert (model.layers, model.hidden, model.embed, model.vocab) == (
        values["encoder_layers"], values["encoder_hidden_size"], values["encoder_embed_dim"], preset.vocab)
    assert model.decoder_size == values["decoder_hidden_size"]
    assert model.dropout_out == values.get("encoder_dropout_out")


def test_layer_map_is_the_placement_plans_layout():
    assert layer_map(1, 3) == (0, 0, 0)
    assert layer_map(2, 4) == (0, 0, 1, 1)
    assert layer_map(3, 4) == (0, 0, 1, 2)  # the first device takes the extra layer
    assert layer_map(3, 4, "1,1,2") == (0, 1, 2, 2)
    with pytest.raises(ValueError, match="every device needs a layer"):
        layer_map(2, 4, "4,0")
