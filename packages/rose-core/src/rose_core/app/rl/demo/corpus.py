"""The text the embedded demo's tokenizer is built from: FrozenLake renderings plus some generic chat text.

Deterministic from a seed; pure, so it can be inspected and tested without the ``[train]`` extra.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from rose_core.app.rl.environments.frozenlake import ACTION_WORDS, FrozenLakeEnv, rendered_words_text

GENERIC_TEXT = (
    "hello, how are you today? i am fine, thank you. what can i do for you? please tell me more about it. "
    "the weather is nice and the sun is out, so we can go for a walk in the park. "
    "can you help me write a short note to my team? sure, here is a draft you can use. "
    "the model answers questions, writes code and explains ideas in simple words. "
    "a request comes in, the server reads it, runs the model and sends the answer back. "
    "what is the time? it is late in the day, but there is still time to finish the work. "
    "we need more data to train a better model, and a good test to know if it works. "
    "this is a good idea. that is not what i asked. why does it fail? because the input was wrong. "
    "first read the question, then think, then answer. keep it short and clear. "
    "my friend likes tea with milk; i like water. they went home after the game. "
    "one, two, three, four, five: count the steps and take the next one. "
    "yes. no. maybe. thanks! good morning. good night. see you soon. "
)
"""Everyday words so the serving model's chat endpoint sees text it can tokenize (unknown words map to unk)."""


def corpus_lines(seed: int = 0, episodes: int = 200) -> Iterator[str]:
    """Rendered episodes under random moves (and a few malformed answers), then the generic text."""
    rng = random.Random(seed)
    yield rendered_words_text()
    answers = [*ACTION_WORDS, "go left", "up up", "i move down", "right.", "stay"]
    for index in range(episodes):
        env = FrozenLakeEnv(seed=rng.randrange(1 << 30), max_turns=4)
        yield env.reset()
        while not env.done:
            answer = answers[index % len(answers)] if index % 3 else rng.choice(answers)
            yield answer
            yield env.step(answer).observation
    for _ in range(20):
        yield GENERIC_TEXT
