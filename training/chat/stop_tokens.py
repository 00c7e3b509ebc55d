"""The tokens that end a generation: every token that ends a turn or a text.

Training ends every assistant answer with the chat template's end-of-turn token (training/methods/sft.py
renders conversations with the tokenizer's own template). A base model's tokenizer often names
<|endoftext|> as its EOS, not the template's <|im_end|>: a generation_config.json with the
tokenizer's EOS alone lets an exported chat model talk on past its answer. The families' instruct
releases list every such token: Qwen2.5-*-Instruct's generation_config.json has eos_token_id
[151645, 151643] (<|im_end|>, <|endoftext|>), Llama-3.1-*-Instruct's [128001, 128008, 128009].
"""

from __future__ import annotations

from typing import Any


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in (value if isinstance(value, (list, tuple)) else [value])]


def end_of_turn_ids(tok: Any) -> list[int]:
    """The token(s) the chat template writes right after an assistant's answer, by the one rule
    preparation masks answers with (training/chat/template.py end_of_turn_tokens); none for a
    tokenizer without a chat template, or one whose template cannot render a plain user/assistant
    turn."""
    from training.chat.template import end_of_turn_tokens

    try:
        return end_of_turn_tokens(tok)
    except ValueError:
        return []


def stop_token_ids(tok: Any, *declared: Any) -> list[int]:
    """The template's end-of-turn token(s), the tokenizer's EOS, then the ids `declared` (the model's
    and generation config's eos_token_id: int, list or None) that the tokenizer has, without
    repeats."""
    out: list[int] = []
    for i in [*end_of_turn_ids(tok), *_ids(tok.eos_token_id), *(i for d in declared for i in _ids(d))]:
        if 0 <= i < len(tok) and i not in out:
            out.append(i)
    return out
