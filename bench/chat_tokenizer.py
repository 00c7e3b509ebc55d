"""A Qwen2-style chat tokenizer built here, with nothing downloaded (no model hub is reachable on
the GPU machine or in CI): byte-level BPE trained with the `tokenizers` library on the text given,
Qwen2's special tokens (<|endoftext|>, <|im_start|>, <|im_end|>) and a chat template in the
format of Qwen2.5-Instruct's tokenizer_config.json (ChatML: a default system turn, then
`<|im_start|>ROLE\\nCONTENT<|im_end|>\\n` per turn; unknown roles render nothing, as Qwen's do).

`python bench/chat_tokenizer.py OUT_DIR [--vocab N]` saves it; tests and bench/sft_task.py import
`build`. `generation_tags=True` wraps assistant turns in {% generation %} markers, the form that
transformers' return_assistant_tokens_mask needs.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from pathlib import Path
from typing import Any

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
DEFAULT_SYSTEM = "You are a helpful assistant."

_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\n" + DEFAULT_SYSTEM + "<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "@GEN_OPEN@{{- message.content + '<|im_end|>\\n' }}@GEN_CLOSE@"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)


def chat_template(generation_tags: bool = False) -> str:
    tags = ("{% generation %}", "{% endgeneration %}") if generation_tags else ("", "")
    return _TEMPLATE.replace("@GEN_OPEN@", tags[0]).replace("@GEN_CLOSE@", tags[1])


def build(texts: Iterable[str], vocab_size: int = 264, generation_tags: bool = False) -> Any:
    """A transformers PreTrainedTokenizerFast: 256 byte symbols + merges + the 3 special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(texts), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",  # noqa: S106 (a token, not a password)
        pad_token="<|endoftext|>",  # noqa: S106
        chat_template=chat_template(generation_tags),
        model_max_length=32768,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--vocab", type=int, default=264)
    p.add_argument("--corpus", help="text file to train the merges on (default: a few sentences)")
    args = p.parse_args()
    texts = Path(args.corpus).read_text().splitlines() if args.corpus else [DEFAULT_SYSTEM, "Hello there."]
    build(texts, args.vocab).save_pretrained(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
