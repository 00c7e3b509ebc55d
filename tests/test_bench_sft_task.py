"""bench/sft_task.py: a held-out split that never overlaps training, records the chat template
renders, and the exact-match check run on a model folder through transformers alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import sft_task
from training.methods.sft import ChatRenderer, conversation


def test_task_split_tokenizer_and_check(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from training.model.build import build_model

    made = sft_task.make(tmp_path / "task", 300, 40, seed=3)
    assert (made["train"], made["eval"]) == (300, 40)
    read = [
        [json.loads(x) for x in (tmp_path / "task" / f).read_text().splitlines()]
        for f in ("train.jsonl", "eval.jsonl")
    ]
    prompts = [{r["messages"][0]["content"] for r in recs} for recs in read]
    assert not prompts[0] & prompts[1] and len(prompts[1]) == 40
    tok = AutoTokenizer.from_pretrained(tmp_path / "task" / "tokenizer")
    assert len(tok) <= 264  # fits --shape tiny
    renderer = ChatRenderer(tok)
    for record in read[1]:
        renderer.render(conversation(record, "eval"), "eval")

    model_dir = tmp_path / "model"
    build_model("random", "tiny", "", seed=0).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    assert AutoModelForCausalLM.from_pretrained(model_dir) is not None
    got = sft_task.check(str(model_dir), str(tmp_path / "task" / "eval.jsonl"), limit=5)
    assert got["prompts"] == 5 and 0 <= got["exact"] <= 5


def test_letters_and_system_turn(tmp_path: Path) -> None:
    """--letters 5 makes every word five letters long (the CPU recipe's lever: the answer's letter i
    then lies a fixed distance back, docs/fine-tuning.md); --system '' opens every record with an
    empty system turn, and `check` prompts with it, as training rendered it."""
    made = sft_task.make(tmp_path / "task", 200, 20, seed=1, kinds=("upper",), letters=(5, 5), system="")
    assert (made["letters"], made["system"]) == ([5, 5], "")
    from transformers import AutoTokenizer

    renderer = ChatRenderer(AutoTokenizer.from_pretrained(tmp_path / "task" / "tokenizer"))
    for name in ("train.jsonl", "eval.jsonl"):
        for line in (tmp_path / "task" / name).read_text().splitlines():
            turns = json.loads(line)["messages"]
            assert [t["role"] for t in turns] == ["system", "user", "assistant"]
            assert turns[0]["content"] == ""
            assert (
                len(turns[2]["content"]) == 5
                and turns[1]["content"] == f"Upper-case: {turns[2]['content'].lower()}"
            )
            renderer.render(conversation(json.loads(line), name), name)  # the empty turn trains
            prompt, answer = sft_task.prompt_and_answer(json.loads(line))
            assert prompt == turns[:2] and answer == turns[2]["content"]
    # The default draws stay as they were (3 to 9 letters), so earlier task sets are made again alike.
    sft_task.make(tmp_path / "default", 200, 20, seed=1, kinds=("upper",))
    lengths = {
        len(json.loads(x)["messages"][1]["content"])
        for x in (tmp_path / "default" / "train.jsonl").read_text().splitlines()
    }
    assert lengths == set(range(3, 10))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--letters", "0-3"], "--letters: '0-3' is not N or MIN-MAX with 1 <= MIN <= MAX <= 15"),
        (["--letters", "9-3"], "--letters: '9-3' is not N or MIN-MAX"),
        (["--letters", "five"], "--letters: 'five' is not N or MIN-MAX"),
        (["--letters", "16"], "--letters: '16' is not N or MIN-MAX"),
        (
            ["--letters", "1", "--kinds", "upper", "--eval", "20"],
            "--eval: 20 held-out prompts need at least 40 different ones; upper with words of 1-1 "
            "letters make 26",
        ),
    ],
)
def test_bad_make_options_are_refused_naming_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    """One line naming the option and what is valid; nothing written (too few distinct prompts
    would otherwise loop forever drawing held-out ones)."""
    with pytest.raises(SystemExit) as exit_:
        sft_task.main(["make", str(tmp_path / "task"), *argv])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "task").exists()
