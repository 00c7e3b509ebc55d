"""Tokenizers laid out as the catalogue families' real releases are, with their published chat
templates (tests/fixtures/chat_templates, SOURCE.md): for tests of what depends on where the
control tokens sit and which one is the EOS, not on the vocabulary itself (nothing downloaded).

How the real releases differ (tokenizer_config.json's added_tokens_decoder and eos_token of each):
- Qwen2/2.5/3: byte-level BPE of 151,643 tokens, then <|endoftext|> 151643, <|im_start|> 151644,
  <|im_end|> 151645 ... as *added* tokens, above the tokenizer's vocab_size (151,643) and below
  the model's (151,936). The base releases (Qwen2.5-*B, Qwen3-*-Base) name <|endoftext|> their EOS;
  the instruct ones (Qwen2.5-*-Instruct, Qwen3-* hybrid) <|im_end|>. (pytorch/torchtune
  torchtune/models/qwen2/_tokenizer.py QWEN2_SPECIAL_TOKENS, qwen2_5/_tokenizer.py.)
- Llama 3.x: BPE of 128,000 tokens, then 256 added control tokens: <|begin_of_text|> 128000,
  <|end_of_text|> 128001, <|start_header_id|> 128006, <|end_header_id|> 128007, <|eom_id|> 128008,
  <|eot_id|> 128009, <|python_tag|> 128010, the rest reserved. Base EOS <|end_of_text|>; instruct
  EOS <|eot_id|>; BOS <|begin_of_text|> (torchtune/models/llama3/_tokenizer.py LLAMA3_SPECIAL_TOKENS).
- Mistral v0.3: sentencepiece; the control tokens are the vocabulary's first ids (<unk> 0, <s> 1,
  </s> 2, [INST] 3, [/INST] 4, [TOOL_CALLS] 5, ...), inside vocab_size; EOS </s>, which also ends
  each answer.
- Gemma 2/3: sentencepiece; <pad> 0, <eos> 1, <bos> 2, <unk> 3, ..., <start_of_turn> 106,
  <end_of_turn> 107 inside vocab_size; EOS <eos> (not the end of turn), BOS <bos>.

Here the vocabulary is a byte-level BPE trained on a few sentences; the control tokens are added
above it (Qwen, Llama 3) or trained into it first (Mistral, Gemma), as in the real releases.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

TEMPLATES = Path(__file__).resolve().parents[2] / "fixtures" / "chat_templates"
CORPUS = [
    "What is 2+3? 5. Answer briefly. Reverse abc cba. Hello there, hi. Let me think: 2 plus 3.",
    "You are a helpful assistant. The weather in Paris is sunny, 21 degrees. get_weather city",
    '{"name": "get_weather", "arguments": {"city": "Paris"}} tool_call tool_response think',
]
QWEN_CONTROL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
                "<tool_response>", "</tool_response>", "<think>", "</think>"]  # fmt: skip
LLAMA_CONTROL = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                 "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>",
                 "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>",
                 "<|python_tag|>"]  # fmt: skip
MISTRAL_CONTROL = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
                   "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"]  # fmt: skip
GEMMA_CONTROL = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]


@dataclass(frozen=True)
class Family:
    template: str  # file in tests/fixtures/chat_templates
    control: list[str]
    eos: str
    end_of_turn: str  # what the template writes after an answer
    above_vocab: bool  # control tokens added after the BPE vocabulary (Qwen, Llama 3)
    bos: str | None = None
    pad: str | None = None
    # Qwen's <think> and <tool_call> are added but not special (normalized text the template writes).
    plain: list[str] = field(default_factory=list)


FAMILIES: dict[str, Family] = {
    "qwen2.5-base": Family("qwen2.5-7b-instruct", QWEN_CONTROL[:3], "<|endoftext|>", "<|im_end|>", True,
                           pad="<|endoftext|>", plain=QWEN_CONTROL[3:]),
    "qwen2.5-instruct": Family("qwen2.5-7b-instruct", QWEN_CONTROL[:3], "<|im_end|>", "<|im_end|>", True,
                               pad="<|endoftext|>", plain=QWEN_CONTROL[3:]),
    "qwen3-base": Family("qwen3-0.6b", QWEN_CONTROL[:3], "<|endoftext|>", "<|im_end|>", True,
                         pad="<|endoftext|>", plain=QWEN_CONTROL[3:]),
    "qwen3": Family("qwen3-0.6b", QWEN_CONTROL[:3], "<|im_end|>", "<|im_end|>", True, pad="<|endoftext|>",
                    plain=QWEN_CONTROL[3:]),
    "llama-3.1-base": Family("llama-3.1-8b-instruct", LLAMA_CONTROL, "<|end_of_text|>", "<|eot_id|>", True,
                             bos="<|begin_of_text|>"),
    "llama-3.1-instruct": Family("llama-3.1-8b-instruct", LLAMA_CONTROL, "<|eot_id|>", "<|eot_id|>", True,
                                 bos="<|begin_of_text|>"),
    "mistral-v0.3": Family("mistral-7b-instruct-v0.3", MISTRAL_CONTROL, "</s>", "</s>", False, bos="<s>"),
    "gemma-2": Family("gemma-2-2b-it", GEMMA_CONTROL, "<eos>", "<end_of_turn>", False, bos="<bos>",
                      pad="<pad>"),
    "gemma-3": Family("gemma-3-270m-it", GEMMA_CONTROL, "<eos>", "<end_of_turn>", False, bos="<bos>",
                      pad="<pad>"),
}  # fmt: skip


@cache
def family_tokenizer(name: str) -> Any:
    """A PreTrainedTokenizerFast laid out as family `name`'s release (a fresh copy: callers may
    change it; see family_tokenizer_copy)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    fam = FAMILIES[name]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300 if fam.above_vocab else 300 + len(fam.control),
        special_tokens=[] if fam.above_vocab else fam.control,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    if fam.above_vocab:
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in fam.control])
    if fam.plain:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in fam.plain])
    out = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=fam.bos,
        eos_token=fam.eos,
        pad_token=fam.pad,
        chat_template=(TEMPLATES / f"{fam.template}.jinja").read_text(encoding="utf-8"),
    )
    assert (out.convert_tokens_to_ids(fam.end_of_turn) >= out.vocab_size) == fam.above_vocab
    return out


def save_family_tokenizer(name: str, folder: Path) -> Any:
    """family_tokenizer(name) saved into `folder` and loaded back as transformers loads a model's."""
    from transformers import AutoTokenizer

    family_tokenizer(name).save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)
