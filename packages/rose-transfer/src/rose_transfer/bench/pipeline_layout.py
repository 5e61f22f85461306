"""Which pipeline stage holds a parameter: contiguous layer ranges per stage, the embedding on the
first stage, the final norm and the LM head on the last (Megatron's and vLLM's layout)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from rose_core.support.errors import RoseError

_LAYER = re.compile(r"(?:^|\.)(?:layers|h|blocks)\.(\d+)\.")
_LAST_STAGE = re.compile(r"(?:^|\.)(?:lm_head|output_layer)\.|^(?:model\.)?(?:norm|final_layernorm|ln_f)\.")


@dataclass(slots=True, frozen=True)
class PipelineLayout:
    """``num_layers`` split over ``stages``: evenly (earlier stages take the remainder) unless
    ``layers_per_stage`` says otherwise."""

    num_layers: int
    stages: int = 1
    layers_per_stage: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.stages < 1 or self.num_layers < 0:
            raise RoseError(f"a pipeline needs >= 1 stage and >= 0 layers, got {self.stages} and {self.num_layers}")
        if self.layers_per_stage and (
            len(self.layers_per_stage) != self.stages or sum(self.layers_per_stage) != self.num_layers
        ):
            raise RoseError(
                f"layers_per_stage {list(self.layers_per_stage)} must have {self.stages} entries "
                f"summing to {self.num_layers} layers"
            )

    def stage_ranges(self) -> list[range]:
        counts = self.layers_per_stage or tuple(
            self.num_layers // self.stages + (1 if s < self.num_layers % self.stages else 0) for s in range(self.stages)
        )
        ranges, start = [], 0
        for count in counts:
            ranges.append(range(start, start + count))
            start += count
        return ranges

    def stage_of(self, name: str) -> int:
        """The stage holding parameter ``name``."""
        layer = _LAYER.search(name)
        if layer is None:
            return self.stages - 1 if _LAST_STAGE.search(name) else 0
        index = int(layer.group(1))
        for stage, layers in enumerate(self.stage_ranges()):
            if index in layers:
                return stage
        raise RoseError(f"{name} is in layer {index}, but the model has {self.num_layers} layers: fix num_layers")
