"""GPU co-location benchmark of the co-serving guard (issue 5, "On a GPU"): rose-core's ``CoServingGuard``
deciding, with CUDA-event time, when a rollout chunk may run beside a serving decode loop.

Run from the repository root (needs torch; rose-core is imported from its source tree, nothing installed):

    PYTHONPATH=packages/rose-core/src python -m benchmarks.gpu.admission [--seconds 8] [--smoke] [--device cuda|cpu]

Without rose-core on the path it stops with one line naming that command. Layout: ``rig`` (the GPU work:
CUDA workloads, streams, graphs, green contexts), ``schedule`` (the arrival process, the policies, the guard
as the bench builds it, the host loop), ``report`` (metrics, ratios, JSON out), ``bench`` (the run).

One process, one CUDA context (``reference/gpu-measurements.md``: across processes the GPU time-slices):

- **Serving**: a decode-step proxy, ``layers`` x (32 tokens x 4096 @ 4096x14336, relu, @ 14336x4096) in bf16
  (about 2.2 ms per step alone on an H200), captured in a CUDA graph and replayed on a high-priority stream.
  An on/off arrival process (seeded, identical in every scenario) gives a ~50% serving duty cycle: bursts of
  back-to-back decode steps (each step is one token of the in-flight requests, with a TPOT budget) separated
  by exponential idle gaps.
- **Rollout**: chunked prefills, one chunk = ``chunk_gemms`` GEMMs of 512 tokens x 4096 @ 4096x14336 replayed
  from a CUDA graph on another stream.
- One host loop drives both for every scenario (same measurement everywhere): it launches serving steps as
  the schedule asks, polls CUDA events for completions, and asks a rollout policy each tick whether to
  launch a chunk. Scenarios: ``serving_alone``, ``rollout_alone``, ``unmanaged`` (rollout keeps two chunks
  queued), ``blind_duty50`` (a chunk, then idle as long as it took: the baseline's blind 50% duty cycle),
  ``guarded`` (the co-serving guard, below) and ``guarded_green`` (the same, plus a CUDA green context that
  confines extra rollout GEMMs to ``--green-sms`` SMs while serving is busy, admitted against a serving
  step time profiled under that dial).

Guarded admission (paper-notes 2.1(c)): a latency model profiled at start (serving step time T_dec, rollout
chunk time T_chunk) and SLO budgets derived from it (B_TPOT = ``--tpot-slo-mult`` x serving-alone TPOT p99;
B_TTFT = T_first + ``--ttft-extra-chunks`` x T_chunk). Every tick, with ``now_eff = now + predicted remaining
time of the rollout chunks already queued``, the guard's slack is

    serving burst in flight (decoding): (last_token_at or arrival) + B_TPOT - now_eff - T_dec - T_chunk
    idle gap (a request arriving now):  now + B_TTFT - now_eff - T_first - T_chunk   (its TTFT slack)

and a chunk is launched only while the slack stays above the guard's margin (``--margin-ms``; the hold
margin it adds is 0 here): no more GPU work is ever queued than fits before the next serving deadline. (The
serving proxy has no prefill: a burst's first step is held to the TPOT rule from its arrival, so no chunk
starts beside any serving step; the TTFT rule only bounds the rollout work queued in an idle gap, i.e. what
an unannounced arrival can find ahead of it.) How the bench's state maps onto the guard's inputs:
``schedule``'s docstring. The JSON names the implementation (``admission_impl``).

Metrics: serving step latency from CUDA events on the serving stream (``tpot_step_ms``: every step except
the first of a burst, i.e. the TPOT steps; ``first_step_ms``: the first step of a burst, the TTFT side),
host-observed TPOT and first-token delay, TPOT SLO attainment, rollout TFLOP/s over the scenario's wall time.
Prints one JSON object on stdout and writes it to ``$OUT/gpu_admission.json`` when ``$OUT`` is set (also
after each scenario, so a crash leaves the finished ones). Progress lines go to stderr. ``--smoke`` runs tiny
sizes for a few tenths of a second per scenario (on CPU when there is no GPU: every path except CUDA timing).
"""

try:
    import rose_core.policy  # noqa: F401  (the bench's modules import it; fail here, once, with the fix)
except ImportError as exc:
    raise SystemExit(
        f"admission bench: cannot import rose_core.policy ({type(exc).__name__}: {exc}); run it from the "
        "repository root as `PYTHONPATH=packages/rose-core/src python -m benchmarks.gpu.admission`"
    ) from exc
