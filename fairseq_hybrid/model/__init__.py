"""The network, as nn code only: embeddings and the stacked LSTM encoder (``encoder``),
the decoder (``decoder``) with its LSTM stack (``lstm_stack``), the attention/combine/output
head (``head``) and its loss (``loss``), dropout masks drawn over whole tensors
(``dropout``), the initialised layers (``initialized_layers``) and the architectures'
sizes (``presets``). Nothing here imports the
engine, the performance model or fairseq's registries."""
