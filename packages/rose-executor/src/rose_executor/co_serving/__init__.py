"""The SLO guard of a serving host, the mechanism: ``CoServing``'s control loop drives rose-core's pure
``CoServingGuard`` with what the engines show (every tick and at once on a serving arrival or finish or a
submitted turn) and turns its verdicts into engine calls (start queued turns, hold / resume the rollout engine,
memory aborts); ``colocated_profile`` measures serving beside a saturated rollout engine for the guard's model.
"""
