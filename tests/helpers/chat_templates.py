"""Tokenizers with the chat formats of real model families, trained in-process (no hub).

`rclc.testing.tiny_tokenizer()` has a minimal ChatML template. These add the two formats the
literal-tokenization rule must hold on, written here from the formats' descriptions:

- a Llama 3 style format: `<|begin_of_text|>`, a header per turn
  (`<|start_header_id|>role<|end_header_id|>\\n\\n`), contents trimmed, `<|eot_id|>` after each;
- a Qwen style ChatML format: a default system turn when the conversation has none, tool
  results wrapped in `<tool_response>` inside a user turn, and the non-special added tokens
  `<think>`, `</think>`, `<tool_call>`, `</tool_call>`, `<tool_response>`, `</tool_response>`.
"""

from __future__ import annotations

from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers, trainers
from tokenizers.models import BPE
from transformers import PreTrainedTokenizerFast

from rclc.testing import TINY_CORPUS

LLAMA3_TEMPLATE = (
    "{{ '<|begin_of_text|>' }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

QWEN_TEMPLATE = (
    "{% if messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'tool' %}"
    "{{ '<|im_start|>user\n<tool_response>\n' + message['content'] + '\n</tool_response><|im_end|>\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\n\n</think>\n\n' }}{% endif %}"
    "{% endif %}"
)

QWEN_ADDED = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")


def _trained(specials: list[str], added: tuple[str, ...] = ()) -> Any:
    backend = Tokenizer(BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    backend.train_from_iterator([TINY_CORPUS] * 4, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend)
    if added:
        tokenizer.add_tokens([AddedToken(text, special=False, normalized=False) for text in added])
    return tokenizer


def llama3_tokenizer() -> Any:
    tokenizer = _trained(["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"])
    tokenizer.bos_token, tokenizer.eos_token = "<|begin_of_text|>", "<|eot_id|>"
    tokenizer.chat_template = LLAMA3_TEMPLATE
    return tokenizer


def qwen_tokenizer() -> Any:
    tokenizer = _trained(["<|endoftext|>", "<|im_start|>", "<|im_end|>"], QWEN_ADDED)
    tokenizer.eos_token, tokenizer.pad_token = "<|im_end|>", "<|endoftext|>"
    tokenizer.chat_template = QWEN_TEMPLATE
    return tokenizer
