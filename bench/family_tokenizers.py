"""Tokenizers shaped like each catalogue family's release, built here (no model hub is reachable on the
GPU machine or in CI): the family's control tokens at their published ids, its BOS added where its
tokenizer adds one, the EOS of its base release, its published chat template
(tests/fixtures/chat_templates), and a vocabulary as long as the model's. Text is byte-level (one
token per byte: no merges), so ids below the control tokens carry text and the ids the family's
model reserves above them exist, as in the real files.

Ids, from the releases' tokenizer.json / tokenizer_config.json: Qwen2.5 and Qwen3 <|endoftext|>
151643, <|im_start|> 151644, <|im_end|> 151645 (Qwen3 also <think> 151667, </think> 151668); Llama
3.x <|begin_of_text|> 128000, <|end_of_text|> 128001, <|start_header_id|> 128006, <|end_header_id|>
128007, <|eom_id|> 128008, <|eot_id|> 128009, <|python_tag|> 128010; Mistral v0.3 <unk> 0, <s> 1,
</s> 2, [INST] 3, [/INST] 4; Gemma 2 <pad> 0, <eos> 1, <bos> 2, <unk> 3, <start_of_turn> 106,
<end_of_turn> 107; Gemma 3 the same but <start_of_turn> 105, <end_of_turn> 106.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TEMPLATES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "chat_templates"

QWEN = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645}
LLAMA = {
    "<|begin_of_text|>": 128000,
    "<|end_of_text|>": 128001,
    "<|start_header_id|>": 128006,
    "<|end_header_id|>": 128007,
    "<|eom_id|>": 128008,
    "<|eot_id|>": 128009,
    "<|python_tag|>": 128010,
}
MISTRAL = {"<unk>": 0, "<s>": 1, "</s>": 2, "[INST]": 3, "[/INST]": 4}
GEMMA2 = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<start_of_turn>": 106, "<end_of_turn>": 107}
GEMMA3 = {**GEMMA2, "<start_of_turn>": 105, "<end_of_turn>": 106}


@dataclass(frozen=True)
class Family:
    template: str  # tests/fixtures/chat_templates/<template>.jinja
    special: dict[str, int]
    eos: str  # the base release's EOS
    end_of_turn: str  # what the template closes an answer with
    bos: str | None = None  # added in front of every encoding, as the release's tokenizer does
    pad: str | None = None
    extra: dict[str, int] = field(default_factory=dict)


# One catalogue entry per family (training/model/configs/).
FAMILIES: dict[str, Family] = {
    "qwen2.5-1.5b": Family("qwen2.5-7b-instruct", QWEN, "<|endoftext|>", "<|im_end|>", pad="<|endoftext|>"),
    "qwen3-4b": Family(
        "qwen3-0.6b",
        {**QWEN, "<think>": 151667, "</think>": 151668},
        "<|endoftext|>",
        "<|im_end|>",
        pad="<|endoftext|>",
    ),
    "llama-3.1-8b": Family(
        "llama-3.1-8b-instruct", LLAMA, "<|end_of_text|>", "<|eot_id|>", bos="<|begin_of_text|>"
    ),
    "llama-3.2-3b": Family(
        "llama-3.2-3b-instruct", LLAMA, "<|end_of_text|>", "<|eot_id|>", bos="<|begin_of_text|>"
    ),
    "mistral-7b-v0.3": Family("mistral-7b-instruct-v0.3", MISTRAL, "</s>", "</s>", bos="<s>"),
    "gemma-2-2b": Family("gemma-2-2b-it", GEMMA2, "<eos>", "<end_of_turn>", bos="<bos>", pad="<pad>"),
    "gemma-3-4b": Family("gemma-3-270m-it", GEMMA3, "<eos>", "<end_of_turn>", bos="<bos>", pad="<pad>"),
}


def build(name: str, vocab_size: int) -> Any:
    """The family's tokenizer (a transformers PreTrainedTokenizerFast) with `vocab_size` ids."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    fam = FAMILIES[name]
    taken = set(fam.special.values())
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    free = (i for i in range(vocab_size) if i not in taken)
    vocab = dict(fam.special)
    for ch in sorted(alphabet):
        vocab[ch] = next(free)
    for i in free:
        vocab[f"<unused{i}>"] = i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in fam.special])
    if fam.bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{fam.bos} $A",
            pair=f"{fam.bos} $A {fam.bos} $B",
            special_tokens=[(fam.bos, fam.special[fam.bos])],
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=fam.bos,
        eos_token=fam.eos,
        pad_token=fam.pad,
        unk_token="<unk>" if "<unk>" in fam.special else None,
        chat_template=(TEMPLATES / f"{fam.template}.jinja").read_text(encoding="utf-8"),
    )
