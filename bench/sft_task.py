"""A learnable instruction task with a held-out split, and its check on an exported model.

No model hub is reachable on the GPU machine, so everything is made here:

    python bench/sft_task.py make OUT [--train 20000] [--eval 500] [--seed 0] [--kinds K,...]
                                      [--letters N|MIN-MAX] [--system TEXT]
        OUT/train.jsonl, OUT/eval.jsonl: chat records ("messages") of string transformations
        (reverse, upper-case, sort the letters, add two numbers) with one exact answer each; the
        eval prompts never occur in the training set. OUT/tokenizer: a Qwen2-style tokenizer
        trained on the task's text (bench/chat_tokenizer.py), with its chat template. Words of one
        length (--letters 5) and an empty system turn (--system '') make the CPU walkthrough's
        task (docs/fine-tuning.md), which the tiny shape learns in minutes.

    python bench/sft_task.py check MODEL_DIR OUT/eval.jsonl [--limit 500]
        Loads MODEL_DIR with transformers alone (AutoModelForCausalLM, AutoTokenizer), greedy-
        decodes every held-out prompt (the turns before its answer) through the folder's chat
        template, and prints one JSON line: the share answered exactly.

Train with `python -m training --data OUT/train.jsonl --eval-data OUT/eval.jsonl --model
OUT/tokenizer --init random ...`; the run's export (STORAGE_PATH/RUN_NAME/model) is MODEL_DIR.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: bench/ beside training/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import chat_tokenizer

LETTERS = "abcdefghijklmnopqrstuvwxyz"


KINDS = ("reverse", "upper", "sort", "add")
LETTERS_DEFAULT = (3, 9)  # a word's length, drawn uniformly from [min, max]
# `check` generates at most 16 new tokens: a longer answer (a token per letter at most, then the
# end-of-turn token) could never be exact.
LETTERS_MAX = 15


def parse_letters(text: str) -> tuple[int, int]:
    """'N' or 'MIN-MAX' -> (min, max); ValueError naming what is valid."""
    parts = text.split("-")
    valid = f"N or MIN-MAX with 1 <= MIN <= MAX <= {LETTERS_MAX}"
    if len(parts) > 2 or not all(x.strip().isdigit() for x in parts):
        raise ValueError(f"{text!r} is not {valid}")
    lo, hi = int(parts[0]), int(parts[-1])
    if not 1 <= lo <= hi <= LETTERS_MAX:
        raise ValueError(f"{text!r} is not {valid}")
    return lo, hi


def distinct_prompts(kinds: tuple[str, ...], letters: tuple[int, int]) -> int:
    """How many different prompts `kinds` with words of `letters` can make."""
    words = sum(len(LETTERS) ** n for n in range(letters[0], letters[1] + 1))
    return sum(1000 * 1000 if kind == "add" else words for kind in kinds)


def example(
    rng: random.Random, kinds: tuple[str, ...] = KINDS, letters: tuple[int, int] = LETTERS_DEFAULT
) -> tuple[str, str]:
    """(prompt, answer) of one task instance, of one of `kinds`; the words of the string tasks
    have `letters` (min, max) letters."""
    kind = KINDS.index(kinds[rng.randrange(len(kinds))])
    if kind == 3:
        a, b = rng.randrange(1000), rng.randrange(1000)
        return f"Add {a} and {b}.", str(a + b)
    word = "".join(rng.choice(LETTERS) for _ in range(rng.randint(*letters)))
    if kind == 0:
        return f"Reverse: {word}", word[::-1]
    if kind == 1:
        return f"Upper-case: {word}", word.upper()
    return f"Sort the letters: {word}", "".join(sorted(word))


def make(
    out: Path,
    n_train: int,
    n_eval: int,
    seed: int,
    vocab: int = 264,
    *,
    kinds: tuple[str, ...] = KINDS,
    letters: tuple[int, int] = LETTERS_DEFAULT,
    system: str | None = None,
    tokenizer: Path | None = None,
) -> dict[str, Any]:
    """`kinds`: the tasks of this set; `letters`: (min, max) letters of a word; `system`: a system
    turn opening every record (None: none, so the template writes its default one); `tokenizer`:
    an existing tokenizer folder to copy instead of training one (a second task set for a model
    already trained on the first)."""
    if n_eval * 2 > distinct_prompts(kinds, letters):
        # Held-out prompts are drawn until there are n_eval different ones, and training prompts
        # until one is not held out: with too few distinct prompts that never ends.
        raise ValueError(
            f"--eval: {n_eval} held-out prompts need at least {2 * n_eval} different ones; "
            f"{','.join(kinds)} with words of {letters[0]}-{letters[1]} letters make "
            f"{distinct_prompts(kinds, letters)}: lower --eval or allow more letters"
        )
    rng = random.Random(seed)  # noqa: S311 (a reproducible task, not a secret)
    held: dict[str, str] = {}
    while len(held) < n_eval:
        prompt, answer = example(rng, kinds, letters)
        held[prompt] = answer
    train: list[tuple[str, str]] = []
    while len(train) < n_train:
        prompt, answer = example(rng, kinds, letters)
        if prompt not in held:  # held-out prompts never seen in training
            train.append((prompt, answer))
    out.mkdir(parents=True, exist_ok=True)

    def write(path: Path, pairs: list[tuple[str, str]]) -> None:
        with path.open("w") as f:
            for prompt, answer in pairs:
                turns = [{"role": "system", "content": system}] if system is not None else []
                turns += [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]
                f.write(json.dumps({"messages": turns}) + "\n")

    write(out / "train.jsonl", train)
    write(out / "eval.jsonl", list(held.items()))
    if tokenizer is not None:
        shutil.copytree(tokenizer, out / "tokenizer", dirs_exist_ok=True)
    else:
        texts = [f"{p} {a}" for p, a in train[:5000]] + [chat_tokenizer.DEFAULT_SYSTEM]
        chat_tokenizer.build(texts, vocab_size=vocab).save_pretrained(out / "tokenizer")
    return {
        "train": len(train),
        "eval": len(held),
        "kinds": list(kinds),
        "letters": list(letters),
        "system": system,
        "out": str(out),
    }


def prompt_and_answer(record: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    """The turns before the answer (a system turn, when the record has one, and the question) and
    the answer: the prompt is rendered as the training rendered it."""
    return record["messages"][:-1], record["messages"][-1]["content"]


def check(
    model_dir: str, eval_file: str, limit: int, adapter: str | None = None, compare: str | None = None
) -> dict[str, Any]:
    """Exact-match share of greedy answers to the held-out prompts, transformers alone (with
    `adapter`, a LoRA adapter folder loaded onto `model_dir` by peft alone). With `compare`, a second
    model folder (the merged export) whose logits on every prompt are compared with these."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok: Any = AutoTokenizer.from_pretrained(adapter or model_dir)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    if adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter)
    model = model.to(device).eval()
    other: Any = None
    if compare:
        other = AutoModelForCausalLM.from_pretrained(compare, dtype=torch.bfloat16)
        other = other.to(device).eval()
    diffs: list[float] = []
    records = [json.loads(line) for line in Path(eval_file).read_text().splitlines()[:limit]]
    right = 0
    for record in records:
        prompt, answer = prompt_and_answer(record)
        enc: Any = tok.apply_chat_template(
            prompt, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        with torch.no_grad():
            out = model.generate(**enc.to(device), max_new_tokens=16, do_sample=False)
            if other is not None:
                ids = out[:, :-1]
                a, b = model(input_ids=ids).logits.float(), other(input_ids=ids).logits.float()
                diffs.append(float((a - b).abs().max()))
        got = str(tok.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)).strip()
        right += got == answer
    result = {
        "model": model_dir,
        "adapter": adapter,
        "prompts": len(records),
        "exact": right,
        "exact_share": right / max(1, len(records)),
    }
    if diffs:
        result |= {"compared_with": compare, "max_abs_logit_diff": max(diffs)}
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("out", type=Path)
    m.add_argument("--train", type=int, default=20000)
    m.add_argument("--eval", type=int, default=500)
    m.add_argument("--seed", type=int, default=0)
    m.add_argument(
        "--vocab", type=int, default=264, help="tokenizer size (--shape tiny's embedding holds 264)"
    )
    m.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated tasks of {', '.join(KINDS)}")
    m.add_argument(
        "--letters",
        default="-".join(map(str, LETTERS_DEFAULT)),
        help="letters of a word in the string tasks: N, or MIN-MAX drawn uniformly (default %(default)s)",
    )
    m.add_argument(
        "--system",
        help="a system turn opening every record ('' for an empty one: a shorter conversation than "
        "with the template's default system prompt); default: none",
    )
    m.add_argument("--tokenizer", type=Path, help="copy this tokenizer folder instead of training one")
    c = sub.add_parser("check")
    c.add_argument("model_dir")
    c.add_argument("eval_file")
    c.add_argument("--limit", type=int, default=500)
    c.add_argument("--adapter", help="a LoRA adapter folder to load onto MODEL_DIR with peft")
    c.add_argument("--compare", help="a model folder whose logits are compared with MODEL_DIR(+adapter)'s")
    args = p.parse_args(argv)
    if args.cmd == "make":
        kinds = tuple(k.strip() for k in args.kinds.split(","))
        unknown = [k for k in kinds if k not in KINDS]
        if unknown or not kinds:
            p.error(f"--kinds: {unknown or kinds} not among {', '.join(KINDS)}")
        try:
            letters = parse_letters(args.letters)
        except ValueError as e:
            p.error(f"--letters: {e}")
        try:
            made = make(
                args.out,
                args.train,
                args.eval,
                args.seed,
                args.vocab,
                kinds=kinds,
                letters=letters,
                system=args.system,
                tokenizer=args.tokenizer,
            )
        except ValueError as e:
            p.error(str(e))
        print(json.dumps(made))
    else:
        print(json.dumps(check(args.model_dir, args.eval_file, args.limit, args.adapter, args.compare)))


if __name__ == "__main__":
    main()
