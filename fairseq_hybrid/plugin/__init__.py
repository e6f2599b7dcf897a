"""What fairseq sees: the ``hybrid_lstm`` model's registration and presets
(``hybrid_lstm``, ``config``), the ``hybrid_cross_entropy`` criterion, the ``torch_adam``
optimizer, the parse-time checks (``checks``, ``integration``), the Hydra callback and the
patches to fairseq (``fairseq_patches``). This layer wires the model, the engine and the
performance model together."""
