"""Tokenizers laid out as the catalogue families' releases are, built here (no model hub is reachable on
the GPU machine or in CI), with their published chat templates (tests/fixtures/chat_templates,
SOURCE.md): each release's control tokens at their published ids, which one is the EOS, which the
end of turn, the BOS its tokenizer adds. One table (RELEASES) and two builders:

- `build(name, vocab_size)`: a catalogue family (FAMILIES, its base release) with a vocabulary as long
  as the model's. Text is byte-level (one token per byte: no merges), so ids below the control tokens
  carry text and the ids the model reserves above them exist, as in the real files (bench/families.py,
  tests that build a narrowed model of the family).
- `family_tokenizer(name)`: a release (RELEASES) over a byte-level BPE trained on a few sentences, the
  control tokens added above it (Qwen, Llama 3) or trained into it first (Mistral, Gemma), in their
  release's order: for tests of what depends on where the control tokens sit and which one is the
  EOS, not on the vocabulary itself.

How the releases differ (tokenizer_config.json's added_tokens_decoder and eos_token of each):
- Qwen2/2.5/3: byte-level BPE of 151,643 tokens, then <|endoftext|> 151643, <|im_start|> 151644,
  <|im_end|> 151645 ... as *added* tokens, above the tokenizer's vocab_size (151,643) and below
  the model's (151,936). The base releases (Qwen2.5-*B, Qwen3-*-Base) name <|endoftext|> their EOS;
  the instruct ones (Qwen2.5-*-Instruct, Qwen3-* hybrid) <|im_end|>. <tool_call> 151657,
  </tool_call> 151658 (and Qwen3's <tool_response> 151665, </tool_response> 151666, <think> 151667,
  </think> 151668) are added but not special. (pytorch/torchtune torchtune/models/qwen2/_tokenizer.py
  QWEN2_SPECIAL_TOKENS, qwen2_5/_tokenizer.py.)
- Llama 3.x: BPE of 128,000 tokens, then 256 added control tokens: <|begin_of_text|> 128000,
  <|end_of_text|> 128001, <|start_header_id|> 128006, <|end_header_id|> 128007, <|eom_id|> 128008,
  <|eot_id|> 128009, <|python_tag|> 128010, the rest reserved. Base EOS <|end_of_text|>; instruct
  EOS <|eot_id|>; BOS <|begin_of_text|> (torchtune/models/llama3/_tokenizer.py LLAMA3_SPECIAL_TOKENS).
- Mistral v0.3: sentencepiece; the control tokens are the vocabulary's first ids (<unk> 0, <s> 1,
  </s> 2, [INST] 3, [/INST] 4, [TOOL_CALLS] 5, ...), inside vocab_size; EOS </s>, which also ends
  each answer.
- Gemma 2: sentencepiece; <pad> 0, <eos> 1, <bos> 2, <unk> 3, ..., <start_of_turn> 106,
  <end_of_turn> 107 inside vocab_size; EOS <eos> (not the end of turn), BOS <bos>. Gemma 3 the
  same but <start_of_turn> 105, <end_of_turn> 106.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

TEMPLATES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "chat_templates"
CORPUS = [
    "What is 2+3? 5. Answer briefly. Reverse abc cba. Hello there, hi. Let me think: 2 plus 3.",
    "You are a helpful assistant. The weather in Paris is sunny, 21 degrees. get_weather city",
    '{"name": "get_weather", "arguments": {"city": "Paris"}} tool_call tool_response think',
]

QWEN = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645}
QWEN2_PLAIN = {"<tool_call>": 151657, "</tool_call>": 151658}
QWEN3_PLAIN = {**QWEN2_PLAIN, "<tool_response>": 151665, "</tool_response>": 151666, "<think>": 151667,
               "</think>": 151668}  # fmt: skip
LLAMA = {
    "<|begin_of_text|>": 128000,
    "<|end_of_text|>": 128001,
    "<|reserved_special_token_0|>": 128002,
    "<|reserved_special_token_1|>": 128003,
    "<|finetune_right_pad_id|>": 128004,
    "<|reserved_special_token_2|>": 128005,
    "<|start_header_id|>": 128006,
    "<|end_header_id|>": 128007,
    "<|eom_id|>": 128008,
    "<|eot_id|>": 128009,
    "<|python_tag|>": 128010,
}
MISTRAL = {"<unk>": 0, "<s>": 1, "</s>": 2, "[INST]": 3, "[/INST]": 4, "[TOOL_CALLS]": 5,
           "[AVAILABLE_TOOLS]": 6, "[/AVAILABLE_TOOLS]": 7, "[TOOL_RESULTS]": 8,
           "[/TOOL_RESULTS]": 9}  # fmt: skip
GEMMA2 = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<start_of_turn>": 106, "<end_of_turn>": 107}
GEMMA3 = {**GEMMA2, "<start_of_turn>": 105, "<end_of_turn>": 106}


@dataclass(frozen=True)
class Family:
    template: str  # tests/fixtures/chat_templates/<template>.jinja
    special: dict[str, int]  # control tokens at the release's ids
    eos: str
    end_of_turn: str  # what the template closes an answer with
    bos: str | None = None  # added in front of every encoding by build(), as the release's tokenizer does
    pad: str | None = None
    # Added but not special (normalized text the template writes): Qwen's <think> and <tool_call>.
    plain: dict[str, int] = field(default_factory=dict)

    @property
    def above_vocab(self) -> bool:
        """Control tokens added after the text vocabulary (Qwen, Llama 3), not its first ids
        (Mistral, Gemma)."""
        return min(self.special.values()) > 0


RELEASES: dict[str, Family] = {
    "qwen2.5-base": Family("qwen2.5-7b-instruct", QWEN, "<|endoftext|>", "<|im_end|>", pad="<|endoftext|>",
                           plain=QWEN2_PLAIN),
    "qwen2.5-instruct": Family("qwen2.5-7b-instruct", QWEN, "<|im_end|>", "<|im_end|>", pad="<|endoftext|>",
                               plain=QWEN2_PLAIN),
    "qwen3-base": Family("qwen3-0.6b", QWEN, "<|endoftext|>", "<|im_end|>", pad="<|endoftext|>",
                         plain=QWEN3_PLAIN),
    "qwen3": Family("qwen3-0.6b", QWEN, "<|im_end|>", "<|im_end|>", pad="<|endoftext|>", plain=QWEN3_PLAIN),
    "llama-3.1-base": Family("llama-3.1-8b-instruct", LLAMA, "<|end_of_text|>", "<|eot_id|>",
                             bos="<|begin_of_text|>"),
    "llama-3.1-instruct": Family("llama-3.1-8b-instruct", LLAMA, "<|eot_id|>", "<|eot_id|>",
                                 bos="<|begin_of_text|>"),
    "llama-3.2-base": Family("llama-3.2-3b-instruct", LLAMA, "<|end_of_text|>", "<|eot_id|>",
                             bos="<|begin_of_text|>"),
    "mistral-v0.3": Family("mistral-7b-instruct-v0.3", MISTRAL, "</s>", "</s>", bos="<s>"),
    "gemma-2": Family("gemma-2-2b-it", GEMMA2, "<eos>", "<end_of_turn>", bos="<bos>", pad="<pad>"),
    "gemma-3": Family("gemma-3-270m-it", GEMMA3, "<eos>", "<end_of_turn>", bos="<bos>", pad="<pad>"),
}  # fmt: skip

# One catalogue entry per family (training/model/configs/), as its base release.
FAMILIES: dict[str, Family] = {
    "qwen2.5-1.5b": RELEASES["qwen2.5-base"],
    "qwen3-4b": RELEASES["qwen3-base"],
    "llama-3.1-8b": RELEASES["llama-3.1-base"],
    "llama-3.2-3b": RELEASES["llama-3.2-base"],
    "mistral-7b-v0.3": RELEASES["mistral-v0.3"],
    "gemma-2-2b": RELEASES["gemma-2"],
    "gemma-3-4b": RELEASES["gemma-3"],
}


def _template(fam: Family) -> str:
    return (TEMPLATES / f"{fam.template}.jinja").read_text(encoding="utf-8")


def build(name: str, vocab_size: int) -> Any:
    """Catalogue family `name`'s tokenizer (a transformers PreTrainedTokenizerFast) with `vocab_size` ids."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    fam = FAMILIES[name]
    taken = set(fam.special.values()) | set(fam.plain.values())
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    free = (i for i in range(vocab_size) if i not in taken)
    vocab = {**fam.special, **fam.plain}
    for ch in sorted(alphabet):
        vocab[ch] = next(free)
    for i in free:
        vocab[f"<unused{i}>"] = i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in fam.special])
    if fam.plain:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in fam.plain])
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
        chat_template=_template(fam),
    )


@cache
def family_tokenizer(name: str) -> Any:
    """A small PreTrainedTokenizerFast laid out as release `name` (RELEASES) is: its control tokens in
    their release's order, above the trained vocabulary or first in it. One object per name: callers
    that change it copy it first (or use save_family_tokenizer)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    fam = RELEASES[name]
    control = sorted(fam.special, key=fam.special.__getitem__)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300 if fam.above_vocab else 300 + len(control),
        special_tokens=[] if fam.above_vocab else control,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    if fam.above_vocab:
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    if fam.plain:
        plain = sorted(fam.plain, key=fam.plain.__getitem__)
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in plain])
    out = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=fam.bos,
        eos_token=fam.eos,
        pad_token=fam.pad,
        chat_template=_template(fam),
    )
    end = out.convert_tokens_to_ids(fam.end_of_turn)
    assert isinstance(end, int) and (end >= out.vocab_size) == fam.above_vocab
    return out


def save_family_tokenizer(name: str, folder: Path) -> Any:
    """family_tokenizer(name) saved into `folder` and loaded back as transformers loads a model's."""
    from transformers import AutoTokenizer

    family_tokenizer(name).save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)
