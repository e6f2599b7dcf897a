"""Tests of fairseq_hybrid/parallel/interface.py."""
import inspect
import typing

from fairseq_hybrid.parallel.interface import HybridModel
from helpers import make_dictionary, make_model


def test_the_plugins_model_is_what_the_engine_asks_of_a_model():
    """The model the plugin builds has every member of the protocol, of its declared type,
    and its ``draw_step`` takes every argument the protocol's does, by the same name."""
    model = make_model(make_dictionary())
    hints = typing.get_type_hints(HybridModel)
    assert set(hints) == {"encoder", "decoder"}
    for name, kind in hints.items():
        assert isinstance(getattr(model, name), kind), name
    wanted = inspect.signature(HybridModel.draw_step).parameters
    offered = inspect.signature(model.draw_step).parameters
    assert [name for name in wanted if name != "self"] == list(offered)[:len(wanted) - 1]
    called = inspect.signature(HybridModel.__call__).parameters
    forward = inspect.signature(model.forward).parameters
    assert all(name in forward for name in called if name not in ("self", "kwargs"))
