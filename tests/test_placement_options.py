"""The gate of the placement options (fairseq_hybrid/plugin/placement_options.py): good
values become their types, bad ones one line naming the value and what is allowed, each
message written once in the package; --pipeline-chunks through fairseq's own parser
(auto, an explicit 0, other models)."""
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import fairseq_hybrid  # noqa: F401  (installs the patches: --pipeline-chunks' type)
from fairseq_hybrid.errors import HybridConfigError
from fairseq_hybrid.parallel.placement import AUTO
from fairseq_hybrid.plugin.placement_options import (
    PlacementOptions, chunks_of, parse_balance, parse_chunks, parse_devices, placement_options,
    stored_chunks,
)

CPU = torch.device("cpu")
PACKAGE = Path(__file__).resolve().parents[1] / "fairseq_hybrid"


def gate(layers=(2, 2), **options):
    return placement_options(SimpleNamespace(**options), layers)


def test_good_values_become_their_types():
    options = gate((4, 4), hybrid_devices="cpu, CPU,cpu", hybrid_balance="2,1,1", pipeline_chunks="6",
                   hybrid_head_on_master=True)
    assert options == PlacementOptions((CPU, CPU, CPU), (2, 1, 1), 6, split_head=False)
    assert all(isinstance(device, torch.device) for device in options.devices)
    assert gate() == PlacementOptions(None, None, AUTO, True)  # nothing given: the defaults
    assert gate().all_devices() == ((torch.device("cuda", 0) if torch.cuda.is_available() else CPU),)
    assert gate(hybrid_devices="cpu,cpu", hybrid_balance="").balance is None  # even


def test_pipeline_chunks_has_one_form_of_auto():
    for value in (None, 0, "auto", " AUTO "):
        assert chunks_of(value) is AUTO, value
    assert parse_chunks("auto") is AUTO and gate(pipeline_chunks="auto").chunks is AUTO
    assert chunks_of(4) == parse_chunks("4") == parse_chunks(4) == 4
    assert stored_chunks(AUTO) == 0 and stored_chunks(5) == 5  # fairseq's integer option


@pytest.mark.parametrize("value,shown", [
    ("0", "0"), ("-0", "0"), (-1, "-1"), ("four", "'four'"), (1.5, "1.5"), (True, "True"), ("", "''"),
])
def test_bad_chunks_are_one_line_naming_the_value(value, shown):
    with pytest.raises(HybridConfigError) as error:
        parse_chunks(value)
    assert str(error.value) == (f"fairseq_hybrid: error: --pipeline-chunks {shown} is not allowed: "
                                "an integer >= 1 (1 = no time chunking) or auto")
    with pytest.raises(HybridConfigError, match=f"model.pipeline_chunks {shown} is not allowed"):
        parse_chunks(value, "model.pipeline_chunks")  # where Hydra gave it


def test_a_gpu_listed_twice_is_refused_unless_asked(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert parse_devices("0,cuda:1") == (torch.device("cuda", 0), torch.device("cuda", 1))
    with pytest.raises(HybridConfigError, match=r"'0,cuda:0' lists cuda:0 more than once.*"
                                                "add --hybrid-allow-repeated-devices"):
        parse_devices("0,cuda:0")
    options = gate(hybrid_devices="cuda:0,cuda:0", hybrid_allow_repeated_devices=True, pipeline_chunks=4)
    assert options.devices == (torch.device("cuda", 0),) * 2 and options.chunks == 4


def test_devices_a_checkpoint_trained_on_need_not_exist_here():
    """build_model reads a checkpoint's config for generation, which ignores its devices."""
    with pytest.raises(HybridConfigError, match="cuda:8 is not available"):
        gate(hybrid_devices="cuda:8,cuda:9")
    options = placement_options(SimpleNamespace(hybrid_devices="cuda:8,cuda:9"), (2, 2), on_this_machine=False)
    assert options.devices == (torch.device("cuda", 8), torch.device("cuda", 9))


# every message of the gate: (a call that is refused, the fixed part of its one line)
REFUSED = [
    (lambda: gate(hybrid_devices="cuda:9"),
     "--hybrid-devices 'cuda:9': cuda:9 is not available (this machine has"),
    (lambda: gate(hybrid_devices="gpu0"), "--hybrid-devices 'gpu0': unknown device 'gpu0': use a comma-"),
    (lambda: gate(hybrid_devices="cpu,"), "--hybrid-devices 'cpu,' has an empty entry: use a comma-"),
    (lambda: parse_devices("cpu,CPU,x"), "unknown device 'x'"),
    (lambda: parse_devices("cuda:0,1,0", on_this_machine=False),
     "--hybrid-devices 'cuda:0,1,0' lists cuda:0 more than once: each GPU can be given once"),
    (lambda: gate(hybrid_devices="cpu,cpu,cpu"),
     "--hybrid-devices 'cpu,cpu,cpu' lists 3 devices for 2 encoder / 2 decoder layers: every device needs "
     "a layer, so use at most 2"),
    (lambda: gate(hybrid_devices="cpu,cpu", hybrid_balance="a,b"),
     "--hybrid-balance 'a,b' is not a comma-separated list of integers"),
    (lambda: gate(hybrid_balance="1,1"),
     "--hybrid-balance '1,1' gives layer counts for 2 device(s), but --hybrid-devices is not given (one "
     f"device: {gate().all_devices()[0]}): give one count per device of --hybrid-devices (e.g. "
     "--hybrid-devices cpu,cpu), or leave --hybrid-balance out"),
    (lambda: gate(hybrid_devices="cpu,cpu", hybrid_balance="2"),
     "--hybrid-balance '2' gives layer counts for 1 device(s), but --hybrid-devices 'cpu,cpu' has 2"),
    (lambda: gate(hybrid_devices="cpu,cpu", hybrid_balance="2,1"),
     "--hybrid-balance '2,1' is not allowed: give 2 integers >= 1 (one per device) that sum to the 2 layers"),
    (lambda: parse_balance("2,0", 2, 2), "--hybrid-balance '2,0' is not allowed"),
    (lambda: gate(pipeline_chunks=-1), "--pipeline-chunks -1 is not allowed: an integer >= 1 (1 = no time "
                                       "chunking) or auto"),
]


@pytest.mark.parametrize("call,message", REFUSED)
def test_bad_values_are_one_line_naming_the_value(call, message):
    with pytest.raises(HybridConfigError) as error:
        call()
    line = str(error.value)
    assert "\n" not in line and message in line, line


@pytest.mark.parametrize("fragment", [
    "is not available (this machine has", "unknown device", "has an empty entry",
    "more than once: each GPU", "every device needs a layer, so use at most",
    "is not a comma-separated list of integers", "gives layer counts for",
    "(one per device) that sum to the", "an integer >= 1 (1 = no time chunking) or auto",
])
def test_each_message_is_written_once_in_the_package(fragment):
    """Each placement message has one source line (the gate's), and it is one the gate
    really raises."""
    assert any(fragment in message for _, message in REFUSED)
    where = [f"{path.relative_to(PACKAGE)}:{number}" for path in sorted(PACKAGE.rglob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1) if fragment in line]
    assert len(where) == 1 and where[0].startswith("plugin/placement_options.py:"), where


# ------------------------------------------------------------------ through fairseq's parser
def parse_training(*argv):
    from fairseq import options

    return options.parse_args_and_arch(options.get_training_parser(), list(argv))


@pytest.mark.parametrize("given", [["--pipeline-chunks", "0"], ["--pipeline-chunks=0"], ["--pipeline-chunks", "-2"]])
def test_a_hybrid_runs_parser_refuses_an_explicit_value_below_one(given):
    with pytest.raises(HybridConfigError, match=r"--pipeline-chunks -?\d is not allowed: an integer >= 1"):
        parse_training("data", "--arch", "hybrid_lstm", *given)


def test_the_default_and_auto_are_fairseqs_0_and_the_gates_auto(tmp_path):
    for name in ["dict.en.txt", "dict.de.txt"] + [f"{s}.en-de.{lang}.bin" for s in ("train", "valid")
                                                  for lang in ("en", "de")]:
        (tmp_path / name).write_text("")  # enough of a data directory for the parse-time checks
    for given, stored, chunks in (([], 0, AUTO), (["--pipeline-chunks", "auto"], 0, AUTO),
                                  (["--pipeline-chunks", "3"], 3, 3)):
        args = parse_training(str(tmp_path), "--arch", "hybrid_lstm", "--hybrid-devices", "cpu,cpu", *given)
        assert args.pipeline_chunks == stored
        assert placement_options(args).chunks == chunks


def test_other_models_keep_fairseqs_integer():
    for value, parsed in (("0", 0), ("-2", -2), ("auto", 0), ("3", 3)):
        assert parse_training("data", "--arch", "lstm", "--pipeline-chunks", value).pipeline_chunks == parsed
    with pytest.raises(HybridConfigError, match="--pipeline-chunks 'four' is not allowed"):
        parse_training("data", "--arch", "lstm", "--pipeline-chunks", "four")


# ------------------------------------------------------------------ a model built from its config
def test_a_model_built_from_a_checkpoints_config_keeps_devices_this_machine_lacks():
    """fairseq-generate builds the model from the config a checkpoint holds (its preset's
    architecture function runs there too): the devices it trained on need not exist here,
    generation uses its own (tests/test_cli_hybrid.py trains on 3 devices, generates on 1 and 2)."""
    from dataclasses import asdict

    from fairseq import models
    from omegaconf import OmegaConf

    from fairseq_hybrid.plugin.config import HybridLSTMConfig
    from helpers import make_dictionary, make_task

    sizes = dict(encoder_embed_dim=8, encoder_hidden_size=8, decoder_embed_dim=8, decoder_hidden_size=8,
                 decoder_out_embed_dim=8, max_source_positions=64, max_target_positions=64)
    saved = {**asdict(HybridLSTMConfig(**sizes)), "_name": "hybrid_lstm_wmt_en_de",
             "hybrid_devices": "cuda:0,cuda:1,cuda:2,cuda:3", "pipeline_chunks": 8}
    model = models.build_model(OmegaConf.create(saved), make_task(make_dictionary()))
    assert model.encoder.num_layers == 4  # the preset's
    assert model.runtime.options == PlacementOptions(tuple(torch.device("cuda", i) for i in range(4)), None, 8)
