"""CPU lists as Linux writes them (``taskset -c``, ``VLLM_CPU_OMP_THREADS_BIND``): ``"0,2-3"`` <-> (0, 2, 3);
and the two words a cores setting may take instead (``auto``, ``none``)."""

from __future__ import annotations

AUTO = "auto"
NONE = "none"


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """``"0,2-3"`` -> (0, 2, 3); a ``ValueError`` naming the form for anything else."""
    cores: set[int] = set()
    try:
        for part in text.split(","):
            first, dash, last = part.strip().partition("-")
            cores.update(range(int(first), int(last if dash else first) + 1))
    except ValueError:
        cores.clear()
    if not cores or min(cores) < 0:
        raise ValueError(f"{text!r}: write \"{AUTO}\", \"{NONE}\" or a CPU list such as \"3\" or \"4-7,12\"")
    return tuple(sorted(cores))


def cpu_list(cores: tuple[int, ...]) -> str:
    """(0, 2, 3) -> ``"0,2,3"``."""
    return ",".join(str(c) for c in cores)


def check_cores_setting(text: str) -> None:
    """A ``ValueError`` unless ``text`` is ``auto``, ``none`` or a CPU list."""
    if text not in (AUTO, NONE):
        parse_cpu_list(text)
