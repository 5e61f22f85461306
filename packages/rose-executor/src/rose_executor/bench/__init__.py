"""``rose-executor bench``: serving alone / co-located unguarded / co-located guarded at three bursty loads,
with the real engines, ``RolloutRunner`` and ``CoServing`` loop (``co_serving_bench``), and its command
(``bench_cli``: a table, or ``--json``).
"""
