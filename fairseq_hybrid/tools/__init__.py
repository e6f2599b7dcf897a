"""Tools on top of the plugin: the advisor (``python -m fairseq_hybrid.tools.advise``,
``advice_report``), the converter of fairseq ``lstm`` checkpoints to ``hybrid_lstm
--input-feeding`` (``python -m fairseq_hybrid.tools.from_fairseq_lstm``), the peak-memory
report the benchmarks read (``memory_report``) and the atomic JSON writer (``jsonio``)."""
