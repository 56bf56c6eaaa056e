"""How one sequence picks its next token: the checkpoint's logits processors, then greedy
argmax or a draw from the sequence's own random generator.

Why not `model.generate`: the batching engine decodes many sequences in one forward, and
HF `generate` draws every sampled token from torch's global RNG, so a sequence's draws
would depend on which other sequences shared its steps. Each sequence here owns a
`torch.Generator` seeded from its `Sampling.seed`: a sampled generation depends on its seed
and its logits only, batched or not. Greedy decoding draws nothing and picks exactly what
`generate` picks from the same logits.

The processors are the ones `generate` builds for the same settings (the checkpoint's
`generation_config` fills what `Sampling` leaves open: a repetition penalty, `top_k`, ...),
built by transformers itself so the two never drift apart. That uses two private
`GenerationMixin` methods; `test_token_choice.py` pins their behaviour on the tested
transformers range.

A constrained sequence (`Sampling.constraint`) also holds a `GrammarMask`: its disallowed
tokens are masked before the processors run (so sampling's temperature and `top_p` spread
only over allowed tokens), and the chosen token advances its matcher.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessorList

from ..generation import Sampling
from .grammar_mask import GrammarMask


def generation_config(model: Any, tokenizer: Any, sampling: Sampling, max_new_tokens: int) -> GenerationConfig:
    """The settings native generation always used: the model's end-of-sequence token, the
    tokenizer's padding, `sampling` as HF settings."""
    eos = model.generation_config.eos_token_id
    if eos is None and tokenizer is not None:
        eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer is not None and tokenizer.pad_token_id is not None else eos
    settings: dict[str, Any] = {
        "max_new_tokens": max_new_tokens,
        "do_sample": not sampling.greedy,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "return_dict_in_generate": True,
    }
    if not sampling.greedy:
        settings["temperature"] = sampling.temperature
        if sampling.top_p is not None:
            settings["top_p"] = sampling.top_p
    return GenerationConfig(**settings)


def end_tokens(config: GenerationConfig) -> frozenset[int]:
    """The token IDs that end a sequence (none when the model and tokenizer name none)."""
    eos = config.eos_token_id
    if eos is None:
        return frozenset()
    if isinstance(eos, int):
        return frozenset({eos})
    return frozenset(int(token) for token in eos)


class TokenChooser:
    """Next-token choice for one sequence (called from the engine thread, in step order)."""

    def __init__(
        self, model: Any, config: GenerationConfig, seed: int, prompt: torch.Tensor, mask: GrammarMask | None = None
    ) -> None:
        """`prompt` is what `generate` treats as the sequence's input IDs: the prompt IDs
        `[1, n]` for a token prompt, an empty `[1, 0]` for an embedding prompt. `mask`: the
        sequence's constraint, if it has one."""
        merged, model_kwargs = model._prepare_generation_config(config)
        self.processors: LogitsProcessorList = model._get_logits_processor(
            generation_config=merged,
            input_ids_seq_length=int(prompt.shape[1]),
            encoder_input_ids=prompt,
            prefix_allowed_tokens_fn=None,
            logits_processor=LogitsProcessorList(),
            device=prompt.device,
            model_kwargs=model_kwargs,
        )
        self.greedy = not merged.do_sample
        self.mask = mask
        self.history = prompt
        self.generator: torch.Generator | None = None
        if not self.greedy:
            self.generator = torch.Generator(device=prompt.device)
            self.generator.manual_seed(seed)

    @property
    def plain_greedy(self) -> bool:
        """Greedy with no processor and no constraint: the engine may take one argmax over the whole batch."""
        return self.greedy and len(self.processors) == 0 and self.mask is None

    @property
    def finished(self) -> bool:
        """True when the constraint allows nothing more: the sequence ends after this token."""
        return self.mask is not None and self.mask.exhausted

    def __call__(self, logits: torch.Tensor) -> int:
        """The next token from this sequence's `[vocab]` float32 logits."""
        scores = logits.unsqueeze(0)
        if self.mask is not None:
            scores = self.mask.apply(scores.clone())
        if len(self.processors):
            scores = self.processors(self.history, scores)
        if self.greedy:
            token = int(torch.argmax(scores, dim=-1))
        else:
            probabilities = torch.softmax(scores, dim=-1)
            token = int(torch.multinomial(probabilities, num_samples=1, generator=self.generator))
        self.record(token)
        return token

    def record(self, token: int) -> None:
        """Append a chosen token to the history the processors read (and the constraint's matcher)."""
        if self.mask is not None:
            self.mask.advance(token)
        if len(self.processors):
            tail = torch.tensor([[token]], dtype=self.history.dtype, device=self.history.device)
            self.history = torch.cat([self.history, tail], dim=1)
