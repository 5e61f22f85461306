"""A Qwen-templated tiny policy that calls a tool, for the gateway's tool-call test.

The demo's policy with the Qwen2.5 chat format (``<|im_start|>`` roles, the tools listed in ``<tools>`` in the
system turn, calls written in ``<tool_call>`` tags, results returned in ``<tool_response>``: what vLLM's
``hermes`` parser reads, as ``vllm serve --tool-call-parser hermes`` does for Qwen2.5), warm-started by a short
supervised pass: asked a sum, it calls ``add`` with the question's numbers; once the tool's result is in the
conversation, it answers in words. A 2-layer model has to be steered to emit a call; what it emits is parsed by
vLLM's parser in the gateway, never by this file.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import tokenizers
import torch
import transformers

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<think>", "</think>")
QWEN_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>assistant' }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls or [] %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + tool_call.name + '\", \"arguments\": ' }}"
    "{%- if tool_call.arguments is string %}{{- tool_call.arguments }}{%- else %}{{- tool_call.arguments | tojson }}"
    "{%- endif %}{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""Qwen2.5's chat format (the tools preamble and tags word for word); tool-call arguments given as a JSON
string are written as they are (Qwen3's rule), so a call the parser returned renders back to the same text."""
ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add", "description": "Add two integers.",
        "parameters": {"properties": {"a": {"title": "A", "type": "integer"}, "b": {"title": "B", "type": "integer"}},
                       "required": ["a", "b"], "title": "add_args", "type": "object", "additionalProperties": False},
    },
    "strict": True,
}
"""The tool as the OpenAI Agents SDK sends ``@function_tool def add(a: int, b: int) -> int`` with the docstring
"Add two integers." (``agents.models.chatcmpl_converter.Converter.tool_to_openai``): a 2-layer policy only
calls a tool whose listing it was warm-started on."""


QUESTION = "What is 2 + 3?"
ARGUMENTS = {"a": 2, "b": 3}
SYSTEMS = ("You add numbers.", "Use the tools.", "Be brief.", "You are a calculator. Use the add tool.")


def call_text() -> str:
    """The assistant text of the call, exactly as ``QWEN_TEMPLATE`` renders it back."""
    return f'<tool_call>\n{{"name": "add", "arguments": {json.dumps(ARGUMENTS)}}}\n</tool_call>'


def answer_text() -> str:
    return f"The sum is {sum(ARGUMENTS.values())}."


def build_tool_policy(directory: Path, *, steps: int = 120, seed: int = 0) -> Path:
    """The warm-started policy in ``directory`` (a Hugging Face model directory vLLM and the gateway load);
    generated once per directory."""
    marker = directory / "tool-policy.json"
    if marker.is_file():
        return directory
    shutil.rmtree(directory, ignore_errors=True)
    conversations = _conversations()
    tokenizer = _tokenizer(conversations)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=2048,
            tie_word_embeddings=False, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id))
        _warm_start(model, _examples(tokenizer, conversations), tokenizer.pad_token_id, steps)
    model.to(torch.bfloat16).save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    marker.write_text(json.dumps({"steps": steps, "seed": seed}))
    return directory


def sampled_runs(mask: list[int]) -> list[tuple[int, int]]:
    """[start, end) of each run of sampled tokens (mask 1) in a session's segment."""
    runs, start = [], None
    for i, bit in enumerate([*mask, 0]):
        if bit and start is None:
            start = i
        elif not bit and start is not None:
            runs.append((start, i))
            start = None
    return runs


def save_tool_tokenizer(directory: Path) -> Path:
    """Only the policy's tokenizer (with its chat template) in ``directory``: what the gateway's parsing reads."""
    _tokenizer(_conversations()).save_pretrained(str(directory))
    return directory


Conversation = tuple[list[dict[str, Any]], str]
"""The messages before an assistant turn, and what the assistant says."""


def _conversations() -> list[Conversation]:
    """``QUESTION`` answered by a call to ``add``, and the call's result answered in words, under a few system
    messages (or none). One question: a 2-layer model does not learn to copy numbers from 200 tokens back in
    a few hundred steps, and the test needs a call, not arithmetic."""
    out: list[Conversation] = []
    for system in ([], *([{"role": "system", "content": text}] for text in SYSTEMS)):
        asked = [*system, {"role": "user", "content": QUESTION}]
        call = {"id": "call_0", "type": "function", "function": {"name": "add", "arguments": json.dumps(ARGUMENTS)}}
        answered = [*asked, {"role": "assistant", "content": "", "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": "call_0", "content": str(sum(ARGUMENTS.values()))}]
        out += [(asked, call_text()), (answered, answer_text())]
    return out


def _tokenizer(conversations: list[Conversation]) -> Any:
    """A byte-level BPE trained on the rendered conversations (the Qwen tools preamble becomes a few dozen
    tokens instead of hundreds), the role and tool-call tags as single tokens."""
    raw = tokenizers.Tokenizer(tokenizers.models.BPE())
    raw.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=768, special_tokens=["<pad>", IM_START, IM_END],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    draft = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizers.Tokenizer(tokenizers.models.BPE()),
                                                 chat_template=QWEN_TEMPLATE)
    texts = [draft.apply_chat_template(m, tools=[ADD_TOOL], add_generation_prompt=True, tokenize=False) + reply
             for m, reply in conversations]
    raw.train_from_iterator(texts, trainer)
    raw.add_tokens([tokenizers.AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=raw, eos_token=IM_END, pad_token="<pad>",
                                                chat_template=QWEN_TEMPLATE, model_max_length=2048)


def _examples(tokenizer: Any, conversations: list[Conversation]) -> list[tuple[list[int], list[int]]]:
    eos = tokenizer.convert_tokens_to_ids(IM_END)
    pairs = []
    for messages, reply in conversations:
        prompt = tokenizer.apply_chat_template(messages, tools=[ADD_TOOL], add_generation_prompt=True,
                                               tokenize=False)
        pairs.append((tokenizer.encode(prompt, add_special_tokens=False),
                      [*tokenizer.encode(reply, add_special_tokens=False), eos]))
    return pairs


def _warm_start(model: Any, pairs: list[tuple[list[int], list[int]]], pad: int, steps: int) -> None:
    """Cross-entropy on the replies only (one-cycle AdamW, every pair in every step)."""
    optimiser = torch.optim.AdamW(model.parameters(), lr=5e-3)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimiser, max_lr=5e-3, total_steps=steps, pct_start=0.1)
    width = max(len(p) + len(r) for p, r in pairs)
    ids = torch.full((len(pairs), width), pad)
    labels = torch.full((len(pairs), width), -100)
    mask = torch.zeros((len(pairs), width), dtype=torch.long)
    for i, (prompt, response) in enumerate(pairs):
        sequence = prompt + response
        ids[i, : len(sequence)] = torch.tensor(sequence)
        mask[i, : len(sequence)] = 1
        labels[i, len(prompt): len(sequence)] = torch.tensor(response)
    model.train()
    for _ in range(steps):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        schedule.step()
    model.eval()
