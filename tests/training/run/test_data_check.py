"""`python -m training.prepare --check`: every record read and rendered as the preparation would,
length statistics and what is too long, and a refusal (one line, exit 4) of what training would
refuse. ShareGPT and OpenAI content-part records are converted to the same turns as `messages`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import chat_tokenizer
from training.methods.sft import RecordError, conversation
from training.prepare import main
from training.run.data_check import check

CORPUS = ["What is 2+3? Answer briefly. Hello. Reverse abc cba", chat_tokenizer.DEFAULT_SYSTEM] * 20
MESSAGES = {"messages": [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Hi"},
                         {"role": "assistant", "content": "Hello."}]}  # fmt: skip
SHAREGPT = {
    "conversations": [
        {"from": "system", "value": "Answer briefly."},
        {"from": "human", "value": "Hi"},
        {"from": "gpt", "value": "Hello."},
    ]
}
PARTS = {"messages": [{"role": "system", "content": [{"type": "text", "text": "Answer briefly."}]},
                      {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
                      {"role": "assistant", "content": [{"type": "text", "text": "Hello."}]}]}  # fmt: skip


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("tok")
    chat_tokenizer.build(CORPUS).save_pretrained(out)
    return str(out)


def _jsonl(path: Path, records: list[Any]) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return str(path)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["--check", "--shape", "tiny", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_sharegpt_and_content_parts_are_the_same_turns_as_messages() -> None:
    turns = conversation(MESSAGES, "x")
    assert conversation(SHAREGPT, "x") == turns == conversation(PARTS, "x")
    # ShareGPT's conversations may hold role/content turns too; parts are joined by newlines.
    assert conversation({"conversations": MESSAGES["messages"]}, "x") == turns
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    two = {"messages": [{"role": "user", "content": parts}, {"role": "assistant", "content": "c"}]}
    assert conversation(two, "x")[0]["content"] == "a\nb"


@pytest.mark.parametrize(
    ("record", "match"),
    [
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]},
                       {"role": "assistant", "content": "c"}]},
         r"^x: field messages\[0\]\.content\[0\]: a 'image_url' content part; only text parts .* convert"),
        ({"conversations": [{"from": "human", "value": "q"}, {"from": "function_call", "value": "{}"}]},
         r"^x: field conversations\[1\]\.from: 'function_call' is no ShareGPT speaker .*human, user, gpt"),
        ({"conversations": [{"from": "human", "value": 3}, {"from": "gpt", "value": "a"}]},
         r"^x: field conversations\[0\]\.value: text or a list of text parts expected, got int"),
    ],
)  # fmt: skip
def test_what_cannot_be_converted_is_refused_saying_what_to_convert(
    record: dict[str, Any], match: str
) -> None:
    with pytest.raises(RecordError, match=match):
        conversation(record, "x")


def test_check_reports_lengths_and_an_epoch_of_mixed_formats(
    tmp_path: Path, tok_dir: str, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _jsonl(tmp_path / "chat.jsonl", [SHAREGPT, PARTS, MESSAGES] * 10)
    rc, out, err = _run(capsys, "--data", data, "--model", tok_dir, "--seq-len", "128")
    assert rc == 0 and err == "", err
    assert "[check] ok: training would accept this data" in out
    report = check(data, seq_len=128, model=tok_dir, data_format="chat", log=lambda _: None)
    assert report["records"] == report["used"] == 30 and report["too_long"] == 0
    length = report["lengths"]["min"]
    assert report["lengths"] == {"min": length, "p50": length, "p90": length, "p99": length, "max": length}
    assert report["tokens"] == 30 * length and report["blocks"] == -(-30 // (128 // length))
    assert f"tokens per conversation: min {length}" in out and "one epoch:" in out


def test_most_conversations_too_long_is_refused_not_dropped_silently(
    tmp_path: Path, tok_dir: str, capsys: pytest.CaptureFixture[str]
) -> None:
    long = {"messages": [{"role": "user", "content": "Hello. " * 80}, {"role": "assistant", "content": "ok"}]}
    data = _jsonl(tmp_path / "long.jsonl", [long] * 79 + [MESSAGES] * 21)
    rc, out, err = _run(capsys, "--data", data, "--model", tok_dir, "--seq-len", "64")
    assert rc == 4 and err.count("\n") == 1, err
    assert "79 of 100 conversations (79%) are longer than --seq-len 64 and would be dropped" in err
    assert "--too-long truncate" in err and "--max-dropped-fraction" in err
    assert "longer than --seq-len 64: 79 (79.0%)" in out  # the statistics come first
    rc, _, err = _run(
        capsys, "--data", data, "--model", tok_dir, "--seq-len", "64", "--max-dropped-fraction", "0.8"
    )
    assert rc == 0, err


def test_a_bad_record_is_named_by_line_or_skipped_within_the_allowed_share(
    tmp_path: Path, tok_dir: str, capsys: pytest.CaptureFixture[str]
) -> None:
    no_answer = {"messages": [{"role": "user", "content": "Hi"}]}
    data = _jsonl(
        tmp_path / "bad.jsonl", [MESSAGES, MESSAGES, "", "{oops", MESSAGES, no_answer] + [MESSAGES] * 4
    )
    rc, _, err = _run(capsys, "--data", data, "--model", tok_dir, "--seq-len", "128")
    assert rc == 4 and err.count("\n") == 1, err
    assert f"{data} line 4: malformed JSON" in err and "byte" not in err
    rc, out, err = _run(
        capsys, "--data", data, "--model", tok_dir, "--seq-len", "128", "--max-skipped-fraction", "0.25"
    )
    assert rc == 0, err
    assert "skipped 2 records" in out and f"first: {data} line 4" in out
    rc, _, err = _run(
        capsys, "--data", data, "--model", tok_dir, "--seq-len", "128", "--max-skipped-fraction", "0.1"
    )
    assert rc == 4 and "2 of 9 records (22.22%) were skipped as unusable" in err, err


def test_text_data_and_bad_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _jsonl(tmp_path / "t.jsonl", [{"text": "hello world " * 20}] * 8)
    rc, out, err = _run(capsys, "--data", data, "--seq-len", "64")
    assert rc == 0, err
    assert "tokens per document: min 240" in out and "one epoch: 30 blocks of 64 tokens" in out
    rc, _, err = _run(capsys, "--data", data, "--out", str(tmp_path / "o"))
    assert rc == 2 and "--out: --check writes nothing" in err
