"""Parameter factories shared by the encoder, decoder and head.

Every weight is initialised uniformly in [-0.1, 0.1], as fairseq's ``lstm`` model (and
Luong et al. 2015) do, so the two architectures start from the same distribution.
"""
from __future__ import annotations

import torch.nn as nn

INIT_RANGE = 0.1


def embedding(num_embeddings: int, embed_dim: int, padding_idx: int) -> nn.Embedding:
    """A token embedding whose padding row is zero."""
    module = nn.Embedding(num_embeddings, embed_dim, padding_idx=padding_idx)
    nn.init.uniform_(module.weight, -INIT_RANGE, INIT_RANGE)
    nn.init.zeros_(module.weight[padding_idx])
    return module


def linear(in_features: int, out_features: int, bias: bool = True) -> nn.Linear:
    module = nn.Linear(in_features, out_features, bias=bias)
    nn.init.uniform_(module.weight, -INIT_RANGE, INIT_RANGE)
    if bias:
        nn.init.uniform_(module.bias, -INIT_RANGE, INIT_RANGE)
    return module


def lstm_layer(input_size: int, hidden_size: int) -> nn.LSTM:
    """One unidirectional, time-major LSTM layer (a pipeline stage is one of these)."""
    module = nn.LSTM(input_size, hidden_size, num_layers=1)
    for param in module.parameters():
        nn.init.uniform_(param, -INIT_RANGE, INIT_RANGE)
    return module
