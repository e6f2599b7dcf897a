"""Command-line tools on top of the plugin: the advisor (``python -m
fairseq_hybrid.tools.advise``, ``advice_report``), which reads the planning models, and the
converter of fairseq ``lstm`` checkpoints to ``hybrid_lstm --input-feeding`` (``python -m
fairseq_hybrid.tools.from_fairseq_lstm``)."""
