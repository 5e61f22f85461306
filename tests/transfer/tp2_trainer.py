"""A small TP-2 decoder layer as two trainer ranks hold it (Megatron / vLLM layouts), for the shard
publishing tests: each rank makes only its own shards; ``full_tensor`` is the model the two make up,
built by plain ``torch.cat`` (an oracle independent of the shard plan)."""

from __future__ import annotations

import zlib

import torch

RANKS = 2
HIDDEN, VOCAB, HEADS, KV_HEADS, HEAD_DIM, FFN = 32, 100, 4, 2, 8, 48
Q, KV = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
SPECS = {
    "model.embed_tokens.weight": "vocab;pad=64",
    "model.layers.0.self_attn.qkv_proj.weight": f"qkv;sections={Q}@{HEAD_DIM},{KV}@{HEAD_DIM},{KV}@{HEAD_DIM}",
    "model.layers.0.self_attn.o_proj.weight": "row",
    "model.layers.0.mlp.gate_up_proj.weight": f"gate_up;sections={FFN},{FFN}",
    "model.layers.0.mlp.down_proj.weight": "row",
}
FULL_SHAPES = {
    "model.embed_tokens.weight": (VOCAB, HIDDEN),
    "model.layers.0.input_layernorm.weight": (HIDDEN,),
    "model.layers.0.self_attn.qkv_proj.weight": (Q + 2 * KV, HIDDEN),
    "model.layers.0.self_attn.o_proj.weight": (HIDDEN, Q),
    "model.layers.0.mlp.gate_up_proj.weight": (2 * FFN, HIDDEN),
    "model.layers.0.mlp.down_proj.weight": (HIDDEN, FFN),
    "model.norm.weight": (HIDDEN,),
}
SECTIONS = {  # full sizes of the sections along dim 0 of the fused column-parallel tensors
    "model.layers.0.self_attn.qkv_proj.weight": (Q, KV, KV),
    "model.layers.0.mlp.gate_up_proj.weight": (FFN, FFN),
}
VOCAB_ROWS = (64, VOCAB - 64)  # vocab padded to 128: rank 0 holds 64 rows, rank 1 the 36 real ones left


def local_shape(name: str, rank: int) -> tuple[int, ...]:
    shape = FULL_SHAPES[name]
    spec = SPECS.get(name, "replicated")
    if spec.startswith("vocab"):
        return (VOCAB_ROWS[rank], shape[1])
    if spec == "row":
        return (shape[0], shape[1] // RANKS)
    if spec.startswith(("qkv", "gate_up")):
        return (shape[0] // RANKS, shape[1])
    return shape


def shard(name: str, rank: int, version: int) -> torch.Tensor:
    """Rank ``rank``'s local tensor of ``name`` at ``version`` (2: a sparse change on top of 1)."""
    owner = 0 if name not in SPECS else rank  # replicated tensors are the same on every rank
    gen = torch.Generator().manual_seed(zlib.crc32(f"{name}/{owner}".encode()))
    dtype = torch.float32 if name.endswith("norm.weight") else torch.bfloat16
    tensor = torch.randn(local_shape(name, rank), generator=gen).to(dtype)
    if version >= 2:
        flat = tensor.view(-1)
        flat[owner::41] += 1.0
    return tensor


def local_state(rank: int, version: int) -> dict[str, torch.Tensor]:
    return {name: shard(name, rank, version) for name in FULL_SHAPES}


def full_tensor(name: str, version: int) -> torch.Tensor:
    parts = [shard(name, rank, version) for rank in range(RANKS)]
    spec = SPECS.get(name, "replicated")
    if spec == "replicated":
        return parts[0]
    if spec == "row":
        return torch.cat(parts, dim=1)
    if name in SECTIONS:  # each rank holds its half of every section, sections in order
        halves = [torch.split(p, [size // RANKS for size in SECTIONS[name]]) for p in parts]
        return torch.cat([halves[rank][s] for s in range(len(SECTIONS[name])) for rank in range(RANKS)])
    return torch.cat(parts)


def full_state(version: int) -> dict[str, torch.Tensor]:
    return {name: full_tensor(name, version) for name in FULL_SHAPES}


def rank_main(rank: int, init_method: str, intake: str, secret: bytes, results: object) -> None:
    """One gloo rank: publish its shards of versions 1 and 2; check every rank got the same announcements."""
    import torch.distributed as dist

    from rose_transfer import ShardPublisher

    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=RANKS)
    try:
        me = dist.get_rank()
        digests = []
        with ShardPublisher(secret=secret, intake=intake, rank=me, ranks=dist.get_world_size(), timeout=30.0) as pub:
            for version in (1, 2):
                announce = pub.publish_shard(version, 10 + version, local_state(me, version), SPECS)
                digests.append((announce.version, announce.step, announce.manifest_digest))
        everyone: list[object] = [None] * RANKS
        dist.all_gather_object(everyone, digests)  # metadata only: the model never moves between ranks
        assert all(d == digests for d in everyone), everyone
        results.put((me, digests))  # type: ignore[attr-defined]
    finally:
        dist.destroy_process_group()
