"""fairseq's command-line defaults adapted to one process driving several devices
(fairseq_hybrid/plugin/integration.py)."""
from types import SimpleNamespace

import pytest

from fairseq_hybrid.errors import HybridConfigError
from fairseq_hybrid.plugin.integration import adapt_fairseq_defaults, explicit_option


def test_fairseq_defaults_are_adapted_for_one_process_many_devices():
    assert explicit_option("--ddp-backend", ["x", "--ddp-backend=no_c10d"]) == "no_c10d"
    assert explicit_option("--ddp-backend", ["x"]) is None
    args = SimpleNamespace(distributed_world_size=4, ddp_backend="pytorch_ddp", bf16=False,
                           fp16=True, fp16_no_flatten_grads=False)
    adapt_fairseq_defaults(args, cuda_devices=4, devices=4, argv=["data"])
    assert (args.distributed_world_size, args.ddp_backend) == (1, "legacy_ddp")
    assert args.fp16_no_flatten_grads
    args = SimpleNamespace(distributed_world_size=2, ddp_backend="legacy_ddp", bf16=False)
    adapt_fairseq_defaults(args, cuda_devices=4, devices=4,
                           argv=["--distributed-world-size", "2", "--ddp-backend", "legacy_ddp"])
    assert (args.distributed_world_size, args.ddp_backend) == (2, "legacy_ddp")
    with pytest.raises(HybridConfigError, match="--ddp-backend pytorch_ddp is not allowed with 2 --hybrid-devices"):
        adapt_fairseq_defaults(SimpleNamespace(ddp_backend="pytorch_ddp"), 0, 2, ["--ddp-backend", "pytorch_ddp"])


@pytest.mark.parametrize("argv, backend", [(["data"], "pytorch_ddp"), (["--ddp-backend", "c10d"], "c10d"),
                                           (["--ddp-backend", "legacy_ddp"], "legacy_ddp")])
def test_one_device_per_process_keeps_fairseqs_backend(argv, backend):
    """torch DDP (fairseq's default) where each process drives one device; the user's
    choice stays."""
    args = SimpleNamespace(ddp_backend=backend, bf16=False)
    adapt_fairseq_defaults(args, cuda_devices=1, devices=1, argv=argv)
    assert args.ddp_backend == backend
