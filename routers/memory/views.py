"""Two aligned views of one episode (Router-Mem §3): single steps for retrieval, overlapping
blocks of adjacent steps for deep processing, with maps between them."""

from __future__ import annotations

from dataclasses import dataclass, field

from routers.memory.schema import Episode, Step


@dataclass
class Block:
    block_id: int
    step_ids: list[str]
    start: int  # index of the first step
    end: int    # index one past the last step


@dataclass
class AlignedViews:
    episode: Episode
    block_size: int = 8
    overlap: int = 2
    blocks: list[Block] = field(init=False)
    step_to_blocks: dict[str, list[int]] = field(init=False)

    def __post_init__(self):
        if self.block_size < 1 or not 0 <= self.overlap < self.block_size:
            raise ValueError(f"need block_size >= 1 and 0 <= overlap < block_size, got {self.block_size}, {self.overlap}")
        steps = self.episode.steps
        stride = self.block_size - self.overlap
        self.blocks, self.step_to_blocks = [], {s.step_id: [] for s in steps}
        start = 0
        while start < len(steps):
            end = min(start + self.block_size, len(steps))
            block = Block(len(self.blocks), [s.step_id for s in steps[start:end]], start, end)
            for sid in block.step_ids:
                self.step_to_blocks[sid].append(block.block_id)
            self.blocks.append(block)
            if end == len(steps):
                break
            start += stride

    @property
    def steps(self) -> list[Step]:
        return self.episode.steps

    def blocks_for_steps(self, step_ids: list[str]) -> list[int]:
        """Blocks that contain any of the steps, in temporal order, each once."""
        return sorted({b for sid in step_ids for b in self.step_to_blocks.get(sid, [])})

    def block_steps(self, block_id: int) -> list[Step]:
        b = self.blocks[block_id]
        return self.episode.steps[b.start:b.end]
