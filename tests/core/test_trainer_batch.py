"""The external trainer's binary batch: one sequence per trajectory, split across data-parallel ranks (every row to
exactly one rank, the shares balanced), the turns rebuilt exactly from it, its size close to the unique tokens';
served over real HTTP to two ranks by ``TrainerClient``, which only the trainer's key opens."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator

import pytest

from rose_core.app.gateway.http_server import ApiServer
from rose_core.app.jobs.external_trainer import TRAINER_ROUTES, ExternalTrainer
from rose_core.app.jobs.trainer_batch import decode, encode, rank_batch, split_rows
from rose_core.app.rl.algorithm.sample import TrainSample
from rose_core.app.rl.algorithm.trajectory_rows import rows_of
from rose_core.app.trainer_client import TrainerBatch, TrainerClient
from rose_core.support.errors import RoseError

HEADER = {"step": 3, "base_version": 2, "publish_version": 3, "intake": "tcp://127.0.0.1:1", "ranks": 1}
KEY, AGENTS_KEY = "t" * 32, "a" * 32


def agent_samples(trajectories: int = 16, turns: int = 10, seed: int = 0) -> list[TrainSample]:
    """Multi-turn agent trajectories: each prompt is the last one, its response (4-12 tokens) and a new
    observation or tool result (40-100 tokens): responses are about 9% of the tokens, as in a tool-using agent."""
    rng = random.Random(seed)
    out = []
    for t in range(trajectories):
        prompt = tuple(rng.randrange(5, 50_000) for _ in range(rng.randint(40, 120)))
        for index in range(rng.randint(1, turns)):
            response = tuple(rng.randrange(5, 50_000) for _ in range(rng.randint(4, 12)))
            out.append(TrainSample(f"traj-{t}", index, prompt, response, tuple(-rng.random() for _ in response), 1,
                                   rng.uniform(-1, 1), temperature=0.7, top_p=0.9))
            prompt = prompt + response + tuple(rng.randrange(5, 50_000) for _ in range(rng.randint(40, 100)))
    return out


def key_of(sample: TrainSample) -> tuple[object, ...]:
    """What must come back exactly (the floats travel as float32: compared apart)."""
    return (sample.trajectory_id, sample.turn_index, sample.prompt_token_ids, sample.response_token_ids,
            sample.weight_version)


def test_two_ranks_get_every_turn_once_balanced_and_exactly() -> None:
    samples = agent_samples()
    rows = rows_of(samples, pack=True)
    shares = split_rows(rows, 2)
    assert sorted(shares[0] + shares[1]) == list(range(len(rows)))
    loads = [sum(rows[i][-1].length for i in share) for share in shares]
    assert abs(loads[0] - loads[1]) <= max(row[-1].length for row in rows)
    rebuilt = []
    for rank in (0, 1):
        wire = decode(encode(rank_batch(samples, HEADER, rank, 2)))
        batch = TrainerBatch(wire)
        assert wire.samples == len(samples) and (wire.rank, wire.world, wire.step) == (rank, 2, 3)
        rebuilt += batch.train_samples()
    assert sorted(map(key_of, rebuilt)) == sorted(map(key_of, samples))
    by_key = {(s.trajectory_id, s.turn_index): s for s in samples}
    for sample in rebuilt:  # float32 on the wire
        original = by_key[(sample.trajectory_id, sample.turn_index)]
        assert sample.behaviour_logprobs == pytest.approx(original.behaviour_logprobs, abs=1e-6)
        assert (sample.advantage, sample.temperature, sample.top_p) == pytest.approx(
            (original.advantage, original.temperature, original.top_p), abs=1e-6)


def test_the_batch_costs_its_unique_tokens_their_logprobs_and_a_few_bytes_a_turn() -> None:
    """Each row's tokens once (4 bytes each); on top, 4 bytes per response token (its logprob), 24 per turn and a
    few dozen per row: 1.20x the unique tokens' bytes when responses are 10% of the tokens; the per-turn JSON
    repeats every prompt, as text, and is over 10x larger."""
    from rose_core.app.gateway.openai_api import json_bytes
    from rose_core.app.jobs.external_trainer import sample_json

    samples = agent_samples()
    rows = rows_of(samples, pack=True)
    unique = sum(row[-1].length for row in rows)
    responses = sum(len(s.response_token_ids) for s in samples)
    size = sum(len(encode(rank_batch(samples, HEADER, rank, 2))) for rank in (0, 1))
    assert size <= 4 * unique + 4 * responses + 24 * len(samples) + 48 * len(rows) + 2 * 400, size
    assert len(json_bytes([sample_json(s) for s in samples])) > 10 * size


@pytest.fixture
def api() -> Iterator[tuple[ApiServer, ExternalTrainer]]:
    trainer = ExternalTrainer(1)
    server = ApiServer(trainer, TRAINER_ROUTES, KEY, name="rose-trainer-api",
                       refused_keys={AGENTS_KEY: "the agents' gateway key"}).start()
    yield server, trainer
    server.close()


def test_two_rank_clients_pull_their_halves_over_http(api: tuple[ApiServer, ExternalTrainer]) -> None:
    server, trainer = api
    samples = agent_samples(seed=1)
    got: dict[int, list[TrainSample]] = {}

    def rank(r: int) -> None:
        batch = TrainerClient(server.url, KEY, rank=r, world=2).next_batch(wait_s=10)
        assert batch is not None and batch.step == 5 and batch.publish_version == 5
        got[r] = batch.train_samples()

    pullers = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for puller in pullers:
        puller.start()
    trainer.offer(5, 4, samples, [])
    for puller in pullers:
        puller.join(timeout=30)
    assert sorted(map(key_of, got[0] + got[1])) == sorted(map(key_of, samples)) and got[0] and got[1]
    assert TrainerClient(server.url, KEY).next_batch(wait_s=0, after=5) is None  # this rank trained step 5
    with pytest.raises(RoseError, match="403"):
        TrainerClient(server.url, AGENTS_KEY).next_batch(wait_s=0)
    with pytest.raises(RoseError, match="400"):
        TrainerClient(server.url, KEY, rank=0, world=1)._get("/trainer/batch?rank=2&world=2", 0)


def test_two_ranks_stream_a_steps_parts_as_groups_complete(api: tuple[ApiServer, ExternalTrainer]) -> None:
    """Each rank's ``step_parts`` gets a part as soon as the job offers it (the ranks wait on the long poll while
    the rollout goes on), the step's end adds the final part; the ranks' shares of the parts are the whole batch,
    which a rank that does not stream still pulls at the step's end."""
    server, trainer = api
    samples = agent_samples(trajectories=12, seed=2)
    groups = [[s for s in samples if int(s.trajectory_id.split("-")[1]) // 4 == g] for g in range(3)]
    got: dict[int, list[tuple[int, bool, list[TrainSample]]]] = {0: [], 1: []}
    arrived = {0: threading.Event(), 1: threading.Event()}

    def rank(r: int) -> None:
        for part in TrainerClient(server.url, KEY, rank=r, world=2).step_parts(wait_s=10, after=4):
            got[r].append((part.wire.part, part.final, part.train_samples()))
            arrived[r].set()

    pullers = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for puller in pullers:
        puller.start()
    for group in groups[:2]:  # two groups complete during the rollout; each rank has its share before the next
        for event in arrived.values():
            event.clear()
        trainer.offer_groups(5, 4, group)
        assert all(event.wait(10) for event in arrived.values())
    assert TrainerClient(server.url, KEY).next_batch(wait_s=0, after=4) is None  # no whole batch before the end
    trainer.offer(5, 4, samples, [])  # the step's end: the third group is the final part
    for puller in pullers:
        puller.join(timeout=30)
    for r in (0, 1):
        assert [(part, final) for part, final, _ in got[r]] == [(0, False), (1, False), (2, True)]
    streamed = [s for r in (0, 1) for _, _, part in got[r] for s in part]
    assert sorted(map(key_of, streamed)) == sorted(map(key_of, samples))
    whole = TrainerClient(server.url, KEY).next_batch(wait_s=0, after=4)
    assert whole is not None and whole.final and sorted(map(key_of, whole.train_samples())) == sorted(
        map(key_of, samples))


def test_a_part_past_the_final_one_or_malformed_is_refused(api: tuple[ApiServer, ExternalTrainer]) -> None:
    server, trainer = api
    trainer.offer(1, 0, agent_samples(trajectories=2), [])
    client = TrainerClient(server.url, KEY)
    only = client.next_part(0, wait_s=0)
    assert only is not None and only.final and only.wire.part == 0
    with pytest.raises(RoseError, match=r"400.*step 1 has 1 parts .*stop at the final one"):
        client.next_part(1, wait_s=5)
    with pytest.raises(RoseError, match=r"400.*part = 'x'"):
        client._get("/trainer/batch?part=x", 0)
    with pytest.raises(RoseError, match=r"400.*part = -1"):
        client._get("/trainer/batch?part=-1", 0)
    assert client.next_part(0, wait_s=0, after=1) is None  # nothing of step 2 yet


def test_a_batch_of_another_format_is_one_clear_error() -> None:
    import msgspec

    wire = rank_batch(agent_samples(trajectories=1), HEADER, 0, 1)
    as_map = msgspec.msgpack.encode(msgspec.structs.asdict(wire))  # rose-trainer-batch/1 sent field names
    with pytest.raises(RoseError, match=r"not a rose-trainer-batch/2 batch .* install the same rose-core"):
        decode(as_map)
    with pytest.raises(RoseError, match=r"'rose-trainer-batch/9' batch, this client reads"):
        decode(encode(msgspec.structs.replace(wire, format="rose-trainer-batch/9")))


def test_the_batch_travels_gzipped_to_clients_that_accept_it(api: tuple[ApiServer, ExternalTrainer]) -> None:
    """The client asks for gzip: the bytes received are under the unique tokens' int32 bytes here (the ids are
    mostly zero bytes), the batch the same; a client that does not ask gets it as it is."""
    import urllib.request

    from rose_core.app.gateway.http_server import accepts_gzip

    server, trainer = api
    samples = agent_samples(seed=3)
    trainer.offer(2, 1, samples, [])
    batch = TrainerClient(server.url, KEY).next_batch(wait_s=0)
    assert batch is not None and sorted(map(key_of, batch.train_samples())) == sorted(map(key_of, samples))
    unique = sum(row[-1].length for row in rows_of(samples, pack=True))
    raw = len(encode(batch.wire))
    assert batch.received_bytes < 4 * unique < raw, (batch.received_bytes, 4 * unique, raw)
    plain = urllib.request.Request(f"{server.url}/trainer/batch", headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(plain, timeout=10) as response:
        assert response.headers.get("Content-Encoding") is None and len(response.read()) == raw
    assert [accepts_gzip(h) for h in ("gzip", "br, gzip;q=0.5", "*", "gzip;q=0", "identity", "")] == [
        True, True, True, False, False, False]
