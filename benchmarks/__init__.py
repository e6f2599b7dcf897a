"""Benchmarks of fairseq_hybrid (scaling, pipeline model, head memory, quality study, GPU check):
``python -m benchmarks.<name>``; see benchmarks/README.md. Results go to results/."""
