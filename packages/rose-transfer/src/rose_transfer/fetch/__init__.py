"""The receiving side: ``WeightFetcher``, its connection to a publisher, where each bucket lands (a
file or memory), verification, held bases, and the progress that survives reconnects."""
