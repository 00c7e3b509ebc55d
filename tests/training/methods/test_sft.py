"""Chat data: rendered with the tokenizer's own template, the loss on the assistant's tokens only,
conversations packed whole and isolated from one another, bad records refused by name."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from bench import chat_tokenizer
from training.data import shards
from training.methods.loss import IGNORE_INDEX, labels_and_positions
from training.methods.sft import ChatRenderer, RecordError, conversation, segment_records, write_segment
from training.run.prepare import Segment, Settings

CHATS: list[dict[str, Any]] = [
    {"messages": [{"role": "user", "content": "What is 2+3?"}, {"role": "assistant", "content": "5"}]},
    {"messages": [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Hi"},
                  {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Reverse abc"},
                  {"role": "assistant", "content": "cba"}]},
    {"prompt": "Upper-case: dog", "completion": "DOG"},
    {"prompt": [{"role": "user", "content": "Count to 3"}],
     "completion": [{"role": "assistant", "content": "1 2 3"}]},
]  # fmt: skip
CORPUS = ["What is 2+3? Answer briefly. Hello. Reverse abc cba", chat_tokenizer.DEFAULT_SYSTEM] * 20


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("tok")
    chat_tokenizer.build(CORPUS).save_pretrained(out)
    return str(out)


@pytest.fixture(scope="module")
def tok(tok_dir: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tok_dir)  # as the preparation loads it: from the saved folder


def _answers(tok: Any, ids: np.ndarray, target: np.ndarray) -> list[str]:
    """The decoded runs of target tokens."""
    runs, cur = [], []
    for i, t in zip(ids, target, strict=True):
        if t:
            cur.append(int(i))
        elif cur:
            runs.append(tok.decode(cur))
            cur = []
    return runs + ([tok.decode(cur)] if cur else [])


def test_rendered_prefixes_mark_exactly_the_answers_on_a_qwen2_template(tok: Any) -> None:
    r = ChatRenderer(tok)
    assert r.method == "rendered-prefixes"  # Qwen2.5's template has no {% generation %} markers
    # Each answer through <|im_end|>, where generation stops; not the "\n" ChatML writes after it.
    want = [["5<|im_end|>"], ["Hello.<|im_end|>", "cba<|im_end|>"], ["DOG<|im_end|>"], ["1 2 3<|im_end|>"]]
    for record, answers in zip(CHATS, want, strict=True):
        turns = conversation(record, "x")
        ids, target = r.render(turns, "x")
        # The ids are the template's own tokens: what apply_chat_template gives at inference.
        assert ids.tolist() == tok.apply_chat_template(turns, tokenize=True, return_dict=True)["input_ids"]
        assert _answers(tok, ids, target) == answers


def test_generation_markers_give_the_same_mask_through_transformers(tok: Any) -> None:
    tagged = chat_tokenizer.build(CORPUS, generation_tags=True)
    r = ChatRenderer(tagged)
    assert r.method == "generation-markers"
    plain = ChatRenderer(tok)
    for record in CHATS:
        turns = conversation(record, "x")
        a, b = r.render(turns, "x"), plain.render(turns, "x")
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


@pytest.mark.parametrize(
    ("record", "match"),
    [
        ({"messages": [{"role": "user", "content": "hi"}]}, "field 'messages': no turn with role 'assist"),
        ({"prompt": "hi"}, r"no 'messages' \(or ShareGPT 'conversations'\) field and no 'prompt' and"),
        ({"messages": [{"role": "user", "content": 3}, {"role": "assistant", "content": "x"}]},
         r"field messages\[0\].content: text or a list of text parts expected, got int"),
        ({"messages": [{"content": "x"}]}, r"field messages\[0\].role: a role name expected"),
        ({"messages": "hello"}, "field 'messages': a non-empty list"),
    ],
)  # fmt: skip
def test_bad_records_name_the_record_and_field(record: dict[str, Any], match: str) -> None:
    with pytest.raises(RecordError, match=match) as err:
        conversation(record, "data.jsonl: line at byte 120")
    assert str(err.value).startswith("data.jsonl: line at byte 120: ")


def test_a_role_the_template_does_not_know_is_refused(tok: Any) -> None:
    turns = [
        {"role": "user", "content": "hi"},
        {"role": "bot", "content": "x"},
        {"role": "assistant", "content": "y"},
    ]
    with pytest.raises(
        RecordError, match=r"messages\[1\].role: the chat template renders nothing for role 'bot'"
    ):
        ChatRenderer(tok).render(turns, "f.jsonl: line at byte 0")


@pytest.mark.parametrize("role", ["human", "developer"])
def test_an_unknown_role_in_the_first_turn_is_refused_though_the_template_adds_its_system_text(
    tok: Any, role: str
) -> None:
    # Qwen-style templates render a default system turn when turn 0 is not 'system': the unknown
    # turn itself renders nothing, and the answer would be trained with no question before it.
    turns = [{"role": role, "content": "Reverse: abc"}, {"role": "assistant", "content": "cba"}]
    with pytest.raises(
        RecordError, match=rf"messages\[0\].role: the chat template renders nothing for role '{role}'"
    ):
        ChatRenderer(tok).render(turns, "f.jsonl: line at byte 0")


def test_a_tokenizer_without_chat_template_is_refused(tok: Any) -> None:
    from transformers import PreTrainedTokenizerFast

    bare = PreTrainedTokenizerFast(tokenizer_object=tok.backend_tokenizer)
    with pytest.raises(ValueError, match="has no chat template"):
        ChatRenderer(bare, "m")


def _write(tmp_path: Path, records: list[Any], seq_len: int, too_long: str = "drop", name: str = "c.jsonl"):
    data = tmp_path / name
    data.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    seg = Segment(0, str(data), False, 0, data.stat().st_size)
    return seg, Settings(
        seq_len, "text", "tiny", str(tmp_path / "tok"), 1 << 20, data_format="chat", too_long=too_long
    )


def _read(path: Path, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    tokens = np.fromfile(path, dtype=shards.DTYPE).reshape(-1, seq_len)
    flags = np.fromfile(str(path) + shards.FLAGS_SUFFIX, dtype=np.uint8).reshape(-1, seq_len)
    return tokens, flags


def test_conversations_are_packed_whole_and_overlong_ones_counted(
    tmp_path: Path, tok: Any, tok_dir: str
) -> None:
    (tmp_path / "tok").symlink_to(tok_dir)
    lengths = [len(ChatRenderer(tok).render(conversation(c, "x"), "x")[0]) for c in CHATS]
    seq = max(lengths) + 8
    long = {"messages": [{"role": "user", "content": "word " * seq}, {"role": "assistant", "content": "ok"}]}
    records = [CHATS[0], long, *CHATS[1:], CHATS[0]]
    seg, settings = _write(tmp_path, records, seq)
    counts = write_segment(seg, settings, str(tmp_path / "00000.bin"))
    tokens, flags = _read(tmp_path / "00000.bin", seq)
    assert counts["blocks"] == len(tokens) and counts["documents"] == 5
    assert (counts["too_long"], counts["truncated"]) == (1, 0)
    assert counts["target_tokens"] == int((flags & shards.FLAG_TARGET).astype(bool).sum())
    # Every block starts a conversation; each conversation lies whole inside one block, in order.
    assert (flags[:, 0] & shards.FLAG_START).all()
    kept = [c for c in records if c is not long]
    found = []
    renderer = ChatRenderer(tok)
    for block, bflags in zip(tokens, flags, strict=True):
        starts = [*np.nonzero(bflags & shards.FLAG_START)[0].tolist(), seq]
        for a, b in itertools.pairwise(starts):
            if (bflags[a:b] & shards.FLAG_TARGET).any():
                found.append(block[a:b].tolist())
    assert found == [renderer.render(conversation(c, "x"), "x")[0].tolist() for c in kept]
    assert counts["pad_tokens"] == tokens.size - sum(len(f) for f in found)

    # Truncated: kept when part of an answer survives (a long answer), dropped when the cut falls
    # before the first answer (the long question); both counted as too long.
    long_answer = {
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "word " * seq}]
    }
    seg, settings = _write(tmp_path, [long, long_answer, CHATS[0]], seq, too_long="truncate", name="t.jsonl")
    counts = write_segment(seg, settings, str(tmp_path / "t.bin"))
    assert (counts["too_long"], counts["truncated"], counts["documents"]) == (2, 1, 2)
    tokens, flags = _read(tmp_path / "t.bin", seq)
    assert len(tokens) == 2 and not (flags[0] & shards.FLAG_START)[1:].any()  # the cut answer fills block 0


def test_a_bad_line_names_its_file_and_line(tmp_path: Path, tok_dir: str) -> None:
    (tmp_path / "tok").symlink_to(tok_dir)
    good = json.dumps(CHATS[0])
    seg, settings = _write(tmp_path, [CHATS[0], "", "{not json", CHATS[1]], 256)
    with pytest.raises(
        RecordError,
        match=r"c.jsonl line 3: malformed JSON \(Expecting property name enclosed in double quotes at col",
    ):
        write_segment(seg, settings, str(tmp_path / "x.bin"))
    seg, settings = _write(tmp_path, [CHATS[0], "[1, 2]", CHATS[1]], 256)
    with pytest.raises(RecordError, match=r"c.jsonl line 2: not a JSON object$"):
        write_segment(seg, settings, str(tmp_path / "y.bin"))
    # A record the template refuses is named by its line too.
    seg, settings = _write(
        tmp_path, [CHATS[0], CHATS[1], {"messages": [{"role": "user", "content": "x"}]}], 256
    )
    with pytest.raises(RecordError, match=r"c.jsonl line 3: field 'messages': no turn with role 'assistant'"):
        write_segment(seg, settings, str(tmp_path / "z.bin"))
    assert [w for w, _ in segment_records(_write(tmp_path, [CHATS[0], CHATS[1]], 256)[0])] == [
        f"{tmp_path / 'c.jsonl'}: line at byte 0",
        f"{tmp_path / 'c.jsonl'}: line at byte {len(good) + 1}",
    ]


def test_parquet_records_are_named_by_row(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "c.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": f"p{i}", "completion": f"c{i}"} for i in range(5)]), path,
                   row_group_size=2)  # fmt: skip
    got = list(segment_records(Segment(0, str(path), True, 1, 3)))  # row groups 1-2: rows 2-4
    assert [w for w, _ in got] == [f"{path}: row {i}" for i in (2, 3, 4)]
    assert got[0][1] == {"prompt": "p2", "completion": "c2"}


def test_a_packed_block_gives_each_conversation_its_loss_alone(
    tmp_path: Path, tok: Any, tok_dir: str
) -> None:
    """Position ids restarting per conversation make transformers' sdpa path mask attention
    block-diagonally (masking_utils.find_packed_sequence_indices): every target token's loss in
    the packed block equals its loss with the conversation alone. Without them it does not."""
    from training.model.build import build_model

    (tmp_path / "tok").symlink_to(tok_dir)
    seq = 512
    seg, settings = _write(tmp_path, CHATS, seq)
    write_segment(seg, settings, str(tmp_path / "p.bin"))
    tokens, flags = _read(tmp_path / "p.bin", seq)
    assert len(tokens) == 1 and np.count_nonzero(flags[0] & shards.FLAG_START) == len(CHATS) + 1  # + padding
    model = build_model("random", "tiny", "", seed=0).eval()
    ids = torch.from_numpy(tokens.astype(np.int64))
    labels, positions = labels_and_positions(ids, torch.from_numpy(flags))

    def token_losses(input_ids: torch.Tensor, lab: torch.Tensor, pos: torch.Tensor | None) -> torch.Tensor:
        logits = model(input_ids=input_ids, position_ids=pos, use_cache=False).logits.float()
        return torch.nn.functional.cross_entropy(
            logits[0, :-1], lab[0, 1:], ignore_index=IGNORE_INDEX, reduction="none"
        )

    with torch.no_grad():
        packed = token_losses(ids, labels, positions)
        naive = token_losses(ids, labels, None)  # one causal sequence: later chats see earlier ones
        starts = np.nonzero(flags[0] & shards.FLAG_START)[0].tolist()
        alone = torch.zeros_like(packed)
        for a, b in itertools.pairwise(starts):
            alone[a : b - 1] = token_losses(ids[:, a:b], labels[:, a:b], None)
    on = labels[0, 1:] != IGNORE_INDEX
    torch.testing.assert_close(packed[on], alone[on], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(naive[on], alone[on], rtol=1e-3, atol=1e-3)


@pytest.mark.ray
@pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.*")
def test_prepare_on_ray_writes_chat_shards_and_refuses_a_bad_record_by_name(
    ray_session: str, tmp_path: Path, tok_dir: str
) -> None:
    from training.common.errors import DataError
    from training.data.batches import Batches
    from training.run.prepare import prepare

    corpus = tmp_path / "chats.jsonl"
    corpus.write_text("".join(json.dumps(c) + "\n" for c in CHATS * 30))
    lines: list[str] = []
    kw: dict[str, Any] = dict(seq_len=128, shape="tiny", model=tok_dir, segment_mb=0.002, log=lines.append)
    manifest = prepare(str(corpus), str(tmp_path / "out"), data_format="chat", **kw)
    assert manifest["format"] == shards.CHAT_FORMAT and manifest["documents"] == 120
    assert manifest["tokenizer"]["assistant_mask"] == "rendered-prefixes"
    assert manifest["too_long"] == 0 and manifest["target_tokens"] > 0
    assert any("120 examples" in line for line in lines)
    blocks = shards.TokenBlocks(str(tmp_path / "out"))
    assert blocks.has_flags and len(blocks) == manifest["blocks"]
    b = Batches(blocks, seq_len=128, vocab=264, seed=0, micro=2, accum=1, world=1, rank=0, prefetch=True)
    ids, flags = b.micro_batch_parts(0, 0)
    assert flags is not None and ids.shape == flags.shape == (2, 128)
    assert (flags[:, 0] & shards.FLAG_START).all()
    b.close()
    # Text data's readers refuse it by its format version; the text path is unchanged.
    assert prepare(str(corpus), str(tmp_path / "out"), data_format="chat", **kw) == manifest  # up to date

    bad = tmp_path / "bad.jsonl"
    good = json.dumps(CHATS[0]) + "\n"
    bad.write_text(good * 3 + json.dumps({"messages": [{"role": "user", "content": "x"}]}) + "\n")
    # An input error like a bad text record (training/common/errors.py): one line, exit 4 on the CLI.
    with pytest.raises(DataError) as err:
        prepare(str(bad), str(tmp_path / "bad-out"), data_format="chat", **kw)
    msg = str(err.value)
    assert msg == (f"{bad} line 4: field 'messages': no turn with role 'assistant' (nothing to train on)")
    assert not (tmp_path / "bad-out" / shards.MANIFEST).exists()  # nothing a later run would trust


def test_options_detect_chat_records_and_need_a_chat_tokenizer(tmp_path: Path, tok_dir: str) -> None:
    from training.options.train import OptionError, parse_args

    corpus = tmp_path / "chats.jsonl"
    corpus.write_text("".join(json.dumps(c) + "\n" for c in CHATS))
    base = [
        "--init",
        "random",
        "--shape",
        "tiny",
        "--output-dir",
        str(tmp_path / "run"),
        "--data",
        str(corpus),
    ]
    opts = parse_args([*base, "--model", tok_dir])
    assert opts.data_format == "chat" and opts.too_long == "drop"
    text = tmp_path / "text.jsonl"
    text.write_text('{"text": "x"}\n')
    with pytest.raises(OptionError, match=r"--data-format chat: no 'messages' \(or ShareGPT"):
        parse_args([*base[:-1], str(text), "--data-format", "chat"])
    with pytest.raises(OptionError, match="--text-field: no field 'text'"):
        parse_args([*base, "--model", tok_dir, "--data-format", "text"])


def test_the_manifest_identity_names_the_end_of_turn_token(tok: Any, tok_dir: str) -> None:
    """Data prepared before answers ended at their end-of-turn token (ChatML's "\\n" was a target)
    has another fingerprint, so it is prepared again rather than trusted."""
    from training.methods.sft import tokenizer_identity

    ident = tokenizer_identity(tok_dir)
    assert ident["end_of_turn"] == [tok.convert_tokens_to_ids("<|im_end|>")]
    assert ident["assistant_mask"] == "rendered-prefixes"
