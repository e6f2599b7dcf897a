"""fairseq-hydra-train with the configs in recipes/config (run as the recipes run it) and
with a user's own YAML: the presets hold (the same model as --arch), overrides work without
'+', devices override, nothing is left in the repository root, a Hydra checkpoint resumes
through fairseq-train and generates; bad values stop with one line before anything is
written."""
import os
import re
import shutil
import subprocess
from dataclasses import fields
from pathlib import Path

import pytest
import torch
import yaml

from cli import BIN, CONFIG_DIR, REPO, USER_DIR, hydra_composed, hydra_error_in_process, hypotheses, run_tool

pytestmark = pytest.mark.slow  # end to end through fairseq's CLIs: make test runs it, -m "not slow" skips it

CONFIGS = ("hybrid_lstm", "hybrid_lstm_wmt_en_de")
# what fairseq-hydra-train (Hydra itself) would leave in the directory it runs from
HYDRA_LEFTOVERS = (".hydra", "outputs", "multirun", "hydra_train.log")
SMALL = [
    f"model.{name}=32" for name in (
        "encoder_embed_dim", "encoder_hidden_size", "decoder_embed_dim",
        "decoder_hidden_size", "decoder_out_embed_dim",
    )
]


@pytest.fixture
def data(sample_data):
    return sample_data  # conftest: binarized once per session


def hydra_train(config: str, overrides, check=True, config_dir: Path = CONFIG_DIR, flags=()):
    """fairseq-hydra-train from the repository root, as the README shows it."""
    return run_tool("fairseq-hydra-train", [
        *flags, "--config-dir", str(config_dir), "--config-name", config, *overrides,
    ], cwd=REPO, check=check)


def params(log: str) -> int:
    match = re.search(r"num\. shared model params: ([\d,]+)", log)
    assert match, log[-3000:]
    return int(match.group(1).replace(",", ""))


def leftovers():
    return sorted(name for name in HYDRA_LEFTOVERS if (REPO / name).exists())


def test_every_model_option_is_one_key_of_each_config():
    from fairseq_hybrid.plugin.config import HybridLSTMConfig

    options = {f.name for f in fields(HybridLSTMConfig)} - {
        "_name", "max_source_positions", "max_target_positions",  # task's keys, interpolated
    }
    for name in CONFIGS:
        config = yaml.safe_load((CONFIG_DIR / f"{name}.yaml").read_text())
        assert config["model"]["_name"] == name
        assert options <= set(config["model"]), (name, options - set(config["model"]))
        assert "pipeline_chunks" not in config.get("distributed_training", {}), name
        assert config["hydra"]["run"]["dir"] == "${checkpoint.save_dir}"


def arch_params(data: Path, arch: str) -> int:
    """What ``fairseq-train DATA --arch ARCH`` logs as "num. shared model params", in this
    process: the command line parsed and the model built as fairseq_cli/train.py does
    before it trains, counted as it counts (on the meta device: sizes, no storage)."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    parsed = options.parse_args_and_arch(options.get_training_parser(), [
        str(data), "--user-dir", USER_DIR, "--arch", arch,
        "--criterion", "hybrid_cross_entropy", "--optimizer", "adam",
    ])
    cfg = convert_namespace_to_omegaconf(parsed)
    task = tasks.setup_task(cfg.task)
    with torch.device("meta"):
        model = task.build_model(cfg.model)
    return sum(p.numel() for p in model.parameters() if not getattr(p, "expert", False))


def test_wmt_preset_same_parameters_from_a_users_own_yaml_as_with_arch(data, tmp_path):
    """A YAML naming only the preset (no sizes, no callback) builds the model that
    `fairseq-train --arch hybrid_lstm_wmt_en_de` builds. One update on a tiny batch."""
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump({
        "hydra": {"run": {"dir": str(tmp_path / "out")}},
        "common": {"user_dir": USER_DIR},
        "task": {"_name": "translation", "data": str(data / "bin")},
        "model": {"_name": "hybrid_lstm_wmt_en_de"},
        "criterion": {"_name": "hybrid_cross_entropy"},
        "optimizer": {"_name": "adam"},
        "lr_scheduler": {"_name": "fixed"},
        "optimization": {"lr": [0.001], "max_update": 1},
        "dataset": {"max_tokens": 60, "num_workers": 0, "disable_validation": True},
        "checkpoint": {"no_save": True},
    }))
    hydra = hydra_train("mine", [], config_dir=tmp_path)
    # 4+4 LSTM layers x 1000 alone hold 64M parameters (hybrid_lstm's 2+2 x 256: 2M)
    assert params(hydra.stdout + hydra.stderr) == arch_params(data / "bin", "hybrid_lstm_wmt_en_de") \
        > 64_000_000


@pytest.mark.parametrize("flags,overrides,message", [
    # the callback Hydra runs before a job (one line, exit 1, nothing written; the other
    # values it refuses: the next test, in this process) and the one before a multirun
    ((), ['model.hybrid_devices="cpu,cuda:9"'], "--hybrid-devices 'cpu,cuda:9'"),
    (("--multirun",), ["common.seed=1,2"], "--multirun is not supported"),
])
def test_bad_values_stop_with_one_line_before_anything_is_written(data, tmp_path, flags, overrides, message):
    save = tmp_path / "never"
    proc = hydra_train("hybrid_lstm", [
        f"task.data={data / 'bin'}", f"checkpoint.save_dir={save}", *overrides,
    ], check=False, flags=flags)
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if "fairseq_hybrid: error:" in line]
    assert len(errors) == 1 and message in errors[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert not save.exists()
    assert leftovers() == []


@pytest.mark.parametrize("overrides,message", [
    (["distributed_training.pipeline_chunks=8"],
     "distributed_training.pipeline_chunks 8 is not allowed: hybrid_lstm reads model.pipeline_chunks"),
    (['model.hybrid_devices="cpu,cpu"', "distributed_training.ddp_backend=pytorch_ddp"],
     "--ddp-backend pytorch_ddp is not allowed with 2 --hybrid-devices in one process"),
])
def test_bad_values_are_the_callbacks_one_line_before_the_job(data, tmp_path, overrides, message):
    """The callback on the config Hydra composes from these overrides, in this process
    (``cli.hydra_error_in_process``): the exit with one line that Hydra passes through (how
    fairseq-hydra-train prints it: the test above), and nothing written."""
    save = tmp_path / "never"
    line = hydra_error_in_process("hybrid_lstm", [f"task.data={data / 'bin'}", f"checkpoint.save_dir={save}",
                                                  *overrides])
    assert line.startswith("fairseq_hybrid: error: ") and message in line and "\n" not in line
    assert not save.exists()


def test_adaptations_for_several_gpus_on_the_composed_config(monkeypatch):
    """What the callback does before fairseq spawns anything, as on a 4-GPU machine (whose
    fairseq default world size is 4): one process, per-parameter fp32 copies under fp16;
    a world size the user chose stays."""
    from fairseq.dataclass.configs import DistributedTrainingConfig
    from omegaconf import open_dict

    from fairseq_hybrid.plugin.hydra_callback import explicit_options
    from fairseq_hybrid.plugin.integration import adapt_fairseq_config

    monkeypatch.setattr(DistributedTrainingConfig.__dataclass_fields__["distributed_world_size"], "default", 4)
    overrides = ["task.data=x", "common.fp16=true"]
    cfg = hydra_composed("hybrid_lstm_wmt_en_de", overrides)
    with open_dict(cfg):
        cfg.distributed_training.distributed_world_size = 4
        adapt_fairseq_config(cfg, cuda_devices=4, devices=4, argv=explicit_options(cfg, overrides))
    assert cfg.distributed_training.distributed_world_size == 1
    assert cfg.distributed_training.ddp_backend == "legacy_ddp"
    assert cfg.common.fp16_no_flatten_grads is True

    overrides = ["task.data=x", "distributed_training.distributed_world_size=2"]
    cfg = hydra_composed("hybrid_lstm_wmt_en_de", overrides)
    argv = explicit_options(cfg, overrides)
    assert "--distributed-world-size=2" in argv
    with open_dict(cfg):
        adapt_fairseq_config(cfg, cuda_devices=4, devices=4, argv=argv)
    assert cfg.distributed_training.distributed_world_size == 2
    assert cfg.common.fp16_no_flatten_grads is False


def recipe(script: str, stage: str, env, timeout: int = 300) -> subprocess.CompletedProcess:
    full = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}",
                PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1", **env)
    full.pop("CUDA_VISIBLE_DEVICES", None)
    return subprocess.run(["bash", str(REPO / "recipes" / script), stage], cwd=REPO, env=full,
                          capture_output=True, text=True, timeout=timeout)


def binarized(data: Path, dest: Path) -> Path:
    """``data``'s binarized sample as a finished binarize stage under ``dest``."""
    shutil.copytree(data / "bin", dest)
    (dest / ".done").write_text("test\n")
    return dest


def test_wmt_recipe_trains_through_hydra_and_keeps_the_presets_other_values(data, tmp_path):
    """The WMT recipes' train stage with FRONTEND=hydra: fairseq-hydra-train with
    recipes/config/hybrid_lstm_wmt_en_de.yaml and a few sizes overridden."""
    work = tmp_path / "wmt"
    binarized(data, work / "bin")
    tiny = " ".join([*SMALL, "model.encoder_layers=2", "model.decoder_layers=2"])
    proc = recipe("wmt14_en_de/run.sh", "train", {
        "FRONTEND": "hydra", "DATA_DIR": str(work), "GPUS": "cpu,cpu", "MAX_TOKENS": "400",
        "MAX_UPDATE": "4", "SAVE_INTERVAL": "2", "LOG_INTERVAL": "1", "EXTRA_TRAIN_ARGS": tiny,
    })
    assert proc.returncode == 0, proc.stderr[-3000:]
    save = work / "checkpoints" / "hybrid_lstm_wmt_en_de"
    assert (save / ".done").is_file() and (save / "checkpoint_last.pt").is_file()
    assert "(fairseq-hydra-train)" in proc.stderr and "4/4 updates" in proc.stderr, proc.stderr[-3000:]
    saved = yaml.safe_load((save / ".hydra" / "config.yaml").read_text())
    assert saved["model"]["hybrid_devices"] == "cpu,cpu"
    assert saved["optimization"]["max_update"] == 4 and saved["model"]["encoder_layers"] == 2
    assert leftovers() == []
    assert (save / "checkpoint_1_2.pt").is_file()  # SAVE_INTERVAL: checkpoint.save_interval_updates
    model_cfg = torch.load(save / "checkpoint_last.pt", weights_only=False)["cfg"]["model"]
    # the overrides win; what they left unset is the preset's (no dropout between layers)
    assert (model_cfg["encoder_layers"], model_cfg["decoder_hidden_size"]) == (2, 32)
    assert (model_cfg["encoder_dropout_out"], model_cfg["decoder_dropout_out"]) == (0.0, 0.0)
    assert model_cfg["dropout"] == 0.2


def test_sample_recipe_trains_two_cpu_devices_through_hydra_and_fairseq_train_resumes_and_generates(
        data, tmp_path):
    """The sample recipe's train stage with FRONTEND=hydra: fairseq-hydra-train with
    recipes/config/hybrid_lstm.yaml (the README's command), here on two CPU devices for 3
    updates; its checkpoint resumes with fairseq-train and generates."""
    work = tmp_path / "sample"
    binarized(data, work / "bin")
    before = leftovers()
    proc = recipe("sample/run.sh", "train", {
        "FRONTEND": "hydra", "WORK": str(work), "TRAIN_MINUTES": "30", "MAX_TOKENS": "400", "MAX_UPDATE": "3",
        "DEVICE_ARGS": " ".join([*SMALL, 'model.hybrid_devices="cpu,cpu"', "model.pipeline_chunks=3",
                                 "common.log_interval=1"]),
    })
    assert proc.returncode == 0, proc.stderr[-3000:]
    save = work / "checkpoints"
    assert (save / ".done").is_file()
    assert (save / "checkpoint_last.pt").is_file() and (save / "checkpoint_best.pt").is_file()
    assert "[train][INFO]" in proc.stderr  # the recipe's filter shows Hydra's log lines
    log = (save / "train.log").read_text()
    assert "hybrid placement: 2 device(s), 3 pipeline chunk(s)" in log, log[-3000:]
    # Hydra's own files go to the save dir, none to the directory it ran from
    assert leftovers() == before == []
    saved = yaml.safe_load((save / ".hydra" / "config.yaml").read_text())
    assert saved["model"]["dropout"] == 0.3 and saved["checkpoint"]["patience"] == 5
    assert saved["optimizer"]["_name"] == "torch_adam"
    assert saved["model"]["hybrid_devices"] == "cpu,cpu"
    assert saved["distributed_training"]["ddp_backend"] == "legacy_ddp"
    assert saved["common"]["user_dir"] == USER_DIR  # the YAML's null, filled by the callback
    assert (save / "hydra_train.log").is_file()
    state = torch.load(save / "checkpoint_last.pt", weights_only=False)
    model_cfg = state["cfg"]["model"]
    assert (model_cfg["encoder_layers"], model_cfg["encoder_hidden_size"]) == (2, 32)
    assert state["optimizer_history"][-1]["num_updates"] == 3

    resumed = run_tool("fairseq-train", [
        str(data / "bin"), "--user-dir", USER_DIR, "--arch", "hybrid_lstm",
        "--encoder-embed-dim", "32", "--encoder-hidden-size", "32", "--decoder-embed-dim", "32",
        "--decoder-hidden-size", "32", "--decoder-out-embed-dim", "32", "--share-all-embeddings", "--dropout", "0.3",
        "--criterion", "hybrid_cross_entropy", "--label-smoothing", "0.1",
        "--optimizer", "torch_adam", "--adam-betas", "(0.9, 0.98)", "--lr", "0.003",
        "--clip-norm", "1.0", "--max-tokens", "400", "--max-update", "5",
        "--save-dir", str(save), "--no-epoch-checkpoints", "--num-workers", "0",
    ], cwd=data)
    log = resumed.stdout + resumed.stderr
    assert re.search(r"Loaded checkpoint .*checkpoint_last\.pt \(epoch \d+ @ 3 updates\)", log), log[-3000:]
    assert torch.load(save / "checkpoint_last.pt", weights_only=False)[
        "optimizer_history"][-1]["num_updates"] == 5

    gen = run_tool("fairseq-generate", [
        str(data / "bin"), "--user-dir", USER_DIR, "--path", str(save / "checkpoint_last.pt"),
        "--beam", "2", "--gen-subset", "test", "--batch-size", "8", "--max-len-b", "10",
        "--required-batch-size-multiple", "1",
    ], cwd=data)
    assert len(hypotheses(gen.stdout)) == 20


@pytest.mark.parametrize("env,message", [
    ({"FRONTEND": "hydra", "ARCH": "lstm_luong_wmt_en_de"},
     "error: FRONTEND=hydra trains the hybrid models"),
    ({"FRONTEND": "yaml"}, "error: FRONTEND='yaml': use cli (fairseq-train) or hydra"),
])
def test_recipe_frontend_settings_checked(env, message, tmp_path):
    proc = recipe("wmt14_en_de/run.sh", "train", {"DATA_DIR": str(tmp_path), "GPUS": "cpu", **env})
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1].startswith(message), proc.stderr


def test_pipeline_chunks_auto_is_a_value_of_the_configs_key():
    """The configs' default, and an override, ``auto`` become the model option's 0 (auto)
    before fairseq merges the model's dataclass; a bad value is one line."""
    from omegaconf import open_dict

    from fairseq_hybrid.errors import HybridConfigError
    from fairseq_hybrid.plugin.hydra_callback import normalise_pipeline_chunks

    for overrides, expected in (([], 0), (["model.pipeline_chunks=auto"], 0), (["model.pipeline_chunks=5"], 5)):
        cfg = hydra_composed("hybrid_lstm", ["task.data=x", *overrides])
        with open_dict(cfg):
            normalise_pipeline_chunks(cfg)
        assert cfg.model.pipeline_chunks == expected, overrides
    cfg = hydra_composed("hybrid_lstm", ["task.data=x", "model.pipeline_chunks=many"])
    with pytest.raises(HybridConfigError, match="model.pipeline_chunks 'many' is not allowed: an integer >= 1"):
        with open_dict(cfg):
            normalise_pipeline_chunks(cfg)


def test_patience_resumes_and_a_rerun_after_it_stopped_trains_nothing_through_hydra(data, tmp_path):
    # the same rule as through fairseq-train (tests/test_reliability.py): with lr 0 no
    # validation is better than the first, so patience 2 stops at update 3, also across a resume
    save = tmp_path / "ckpt"

    def train(updates, check=True):
        return hydra_train("hybrid_lstm", [
            f"task.data={data / 'bin'}", f"checkpoint.save_dir={save}", *SMALL,
            "optimization.lr=[0]", "checkpoint.patience=2", "dataset.validate_interval_updates=1",
            "checkpoint.save_interval_updates=1", f"optimization.max_update={updates}",
            "dataset.max_tokens=400", "common.log_interval=1",
        ], check=check)

    def updates():
        return torch.load(save / "checkpoint_last.pt", weights_only=False)["optimizer_history"][-1]["num_updates"]

    train(2)
    assert updates() == 2
    resumed = train(20)
    log = resumed.stdout + resumed.stderr
    assert "early stop" in log
    assert updates() == 3  # fairseq alone restarted the count at update 3: stopped at 5
    again = train(20, check=False)
    assert again.returncode == 0
    assert "--patience 2 already stopped it (2 validations" in again.stderr, again.stderr[-2000:]
    assert updates() == 3
