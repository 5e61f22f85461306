"""How one parameter is split across tensor-parallel ranks: its ``ShardSpec``.

A sharded tensor is cut along one dimension ``dim``. Along it the full tensor is a concatenation of
``sections`` (one for a plain column/row/vocab split; q, k, v for a fused QKV; gate, up for a fused
gate/up). Every section is split over the ranks by whole ``unit``s (a head for attention, 1 element
otherwise), and a rank holds its part of each section, concatenated in section order: exactly the
layout of vLLM's and Megatron's column-parallel fused layers. A section with fewer units than ranks
(KV heads under GQA) gives each rank one unit, replicated over ``ranks / units`` ranks. Vocab splits
round the vocabulary up to ``padding`` and give each rank ``ceil(padded / ranks)`` rows (the last
ranks may hold fewer real rows); local tensors hold only real rows.

Specs travel in ``TensorEntry.shard`` as text: ``replicated``, ``column``, ``row``, ``vocab;pad=64``,
``qkv;sections=4096@128,1024@128,1024@128``, ``gate_up;sections=11008,11008``, ``column;dim=2``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rose_core.support.errors import RoseError

KINDS = ("replicated", "column", "row", "vocab", "qkv", "gate_up")
_DEFAULT_DIM = {"column": 0, "row": 1, "vocab": 0, "qkv": 0, "gate_up": 0}


@dataclass(slots=True, frozen=True)
class Section:
    size: int
    unit: int = 1

    def __post_init__(self) -> None:
        if self.size < 0 or self.unit < 1 or self.size % self.unit:
            raise RoseError(
                f"shard section of {self.size} in units of {self.unit} is invalid: size must be whole units"
            )


@dataclass(slots=True, frozen=True)
class ShardSpec:
    kind: str
    dim: int = -1
    sections: tuple[Section, ...] = field(default_factory=tuple)  # () = one section: the whole dim
    padding: int = 1

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise RoseError(f"unknown shard kind {self.kind!r}: use one of {', '.join(KINDS)}")
        if self.kind != "replicated" and self.dim < 0:
            object.__setattr__(self, "dim", _DEFAULT_DIM[self.kind])
        if self.padding < 1:
            raise RoseError(f"vocab padding must be >= 1, got {self.padding}")

    @property
    def sharded(self) -> bool:
        return self.kind != "replicated"

    def to_text(self) -> str:
        parts = [self.kind]
        if self.sharded and self.dim != _DEFAULT_DIM[self.kind]:
            parts.append(f"dim={self.dim}")
        if self.sections:
            parts.append("sections=" + ",".join(_section_text(s) for s in self.sections))
        if self.padding != 1:
            parts.append(f"pad={self.padding}")
        return ";".join(parts)

    @classmethod
    def parse(cls, text: str) -> ShardSpec:
        kind, *options = text.strip().split(";")
        values: dict[str, str] = {}
        for option in options:
            key, sep, value = option.partition("=")
            if not sep or key not in ("dim", "sections", "pad"):
                raise RoseError(f"bad shard spec {text!r}: options are dim=N, sections=S[@U],..., pad=N")
            values[key] = value
        try:
            sections = tuple(_parse_section(s) for s in values["sections"].split(",")) if "sections" in values else ()
            return cls(kind, int(values.get("dim", -1)), sections, int(values.get("pad", 1)))
        except ValueError as exc:
            raise RoseError(f"bad shard spec {text!r}: {exc}") from exc


def _section_text(section: Section) -> str:
    return str(section.size) if section.unit == 1 else f"{section.size}@{section.unit}"


def _parse_section(text: str) -> Section:
    size, _, unit = text.partition("@")
    return Section(int(size), int(unit or 1))


def spec_sections(spec: ShardSpec, shape: tuple[int, ...] | list[int], name: str = "tensor") -> tuple[Section, ...]:
    """The sections along ``spec.dim``, checked against the tensor's shape."""
    if not 0 <= spec.dim < len(shape):
        raise RoseError(f"{name} of shape {list(shape)} has no dimension {spec.dim} to shard ({spec.to_text()})")
    sections = spec.sections or (Section(shape[spec.dim]),)
    if sum(s.size for s in sections) != shape[spec.dim]:
        raise RoseError(
            f"{name} has {shape[spec.dim]} entries along dim {spec.dim}, its shard spec sections "
            f"{spec.to_text()!r} sum to {sum(s.size for s in sections)}: fix the override or the model shape"
        )
    return sections


def rank_intervals(
    spec: ShardSpec, shape: tuple[int, ...] | list[int], ranks: int, rank: int, name: str = "tensor"
) -> list[tuple[int, int]]:
    """``[start, end)`` intervals along ``spec.dim`` of the full tensor that ``rank`` of ``ranks`` holds,
    in its local order. A replicated tensor is one interval over dim 0 (the whole tensor)."""
    if not 0 <= rank < ranks:
        raise RoseError(f"rank {rank} is outside a tensor-parallel group of {ranks}")
    if not spec.sharded:
        return [(0, shape[0] if shape else 1)]
    intervals, base = [], 0
    for section in spec_sections(spec, shape, name):
        start, end = _section_part(spec, section, ranks, rank, name)
        intervals.append((base + start, base + end))
        base += section.size
    return intervals


def _section_part(spec: ShardSpec, section: Section, ranks: int, rank: int, name: str) -> tuple[int, int]:
    if spec.kind == "vocab":
        padded = -(-section.size // spec.padding) * spec.padding
        per_rank = -(-padded // ranks)
        return min(section.size, rank * per_rank), min(section.size, (rank + 1) * per_rank)
    units = section.size // section.unit
    if units >= ranks:
        if units % ranks:
            raise RoseError(
                f"cannot split {units} units of {section.unit} of {name} over {ranks} ranks: "
                "choose a tensor-parallel degree that divides it"
            )
        per_rank = units // ranks * section.unit
        return rank * per_rank, (rank + 1) * per_rank
    if units == 0 or ranks % units:
        raise RoseError(f"cannot replicate {units} heads of {name} over {ranks} ranks: the degree must be a multiple")
    unit = rank * units // ranks
    return unit * section.unit, (unit + 1) * section.unit


def local_shape(spec: ShardSpec, shape: tuple[int, ...] | list[int], ranks: int, rank: int) -> tuple[int, ...]:
    """The shape of the part of the tensor ``rank`` holds."""
    if not spec.sharded:
        return tuple(shape)
    size = sum(end - start for start, end in rank_intervals(spec, shape, ranks, rank))
    return (*shape[: spec.dim], size, *shape[spec.dim + 1 :])
