"""The benchmarks write their reports with the plugin's one atomic JSON writer."""
from fairseq_hybrid.tools.jsonio import write_json_atomic

__all__ = ["write_json_atomic"]
