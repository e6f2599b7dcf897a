"""Tools on top of the plugin: the advisor (``python -m fairseq_hybrid.tools.advise``,
``advice_report``), the peak-memory report the benchmarks read (``memory_report``) and the
atomic JSON writer (``jsonio``)."""
