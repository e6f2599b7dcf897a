"""The one table of the architectures' sizes (fairseq_hybrid/model/presets.py): what each
``--arch`` preset fills in, the options it hands fairseq's own ``lstm`` (through fairseq's
parser), and the sizes the planning models and the benchmarks read from it."""
from argparse import Namespace

import pytest
from fairseq import options

import fairseq_hybrid  # noqa: F401  (registers hybrid_lstm and its presets)
from fairseq_hybrid.model.presets import BASE_PRESET, PRESETS, preset_options, preset_values
from fairseq_hybrid.planning.sizes import BENCHMARK_PRESETS, ModelSize
from fairseq_hybrid.plugin.config import HybridLSTMConfig, apply_preset


def parsed(*argv):
    return options.parse_args_and_arch(options.get_training_parser(), ["data", *argv])


def unset(**given):
    """An options namespace as fairseq's parser leaves it for hybrid_lstm: every option the
    presets own unset (None) unless given."""
    names = {key for values in PRESETS.values() for key in values}
    assert names <= set(HybridLSTMConfig.__dataclass_fields__)
    return Namespace(**{name: given.get(name) for name in names})


@pytest.mark.parametrize("arch", sorted(PRESETS))
def test_each_preset_fills_the_tables_values_and_a_given_value_wins(arch):
    args = unset()
    apply_preset(args, arch)
    assert vars(args) == {**{key: None for key in vars(args)}, **preset_values(arch)}
    args = unset(encoder_layers=3)
    apply_preset(args, arch)
    assert args.encoder_layers == 3 and args.decoder_layers == preset_values(arch)["decoder_layers"]


def test_a_presets_options_give_fairseqs_lstm_the_same_sizes():
    args = parsed("--arch", "lstm", *preset_options(BASE_PRESET))
    assert {key: getattr(args, key) for key in PRESETS[BASE_PRESET]} == PRESETS[BASE_PRESET]


def test_the_benchmark_presets_read_their_sizes_from_the_table():
    wmt = unset()
    apply_preset(wmt, BENCHMARK_PRESETS["wmt"].arch)
    assert BENCHMARK_PRESETS["wmt"].model == ModelSize(
        wmt.encoder_layers, wmt.encoder_hidden_size, wmt.encoder_embed_dim, 32000,
        dropout=0.1, dropout_out=wmt.encoder_dropout_out)
    assert (wmt.encoder_layers, wmt.encoder_hidden_size, wmt.encoder_dropout_out) == (4, 1000, 0.0)
    small = BENCHMARK_PRESETS["small"].model
    assert (small.layers, small.hidden, small.embed, small.dropout_out, small.has_bridge) == (2, 256, 256, None, False)
    bridged = ModelSize.of_preset(BASE_PRESET, 100)
    assert bridged.decoder_hidden is None and bridged.vocab == 100
