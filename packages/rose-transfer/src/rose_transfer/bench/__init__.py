"""What only benchmarks use (``rose-transfer bench``, ``bench-fetch``, ``bench-codec``): the modelled
slow link, the benchmark model and receivers, transfer planning across clusters, raw ceilings."""
