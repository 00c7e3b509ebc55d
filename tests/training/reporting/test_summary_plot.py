"""The training plot and the data-repeat line: chance level for random ids, a smoothed curve,
final values, and a log line when a run starts another pass over its data."""

from __future__ import annotations

import math
import types

import pytest

from training.reporting import summary
from training.run.loop import _Trainer as Trainer


def _summary(data: str, losses: list[float], **extra) -> dict:
    history = [{"step": i + 1, "loss": v, "tokens_per_s": 1000.0 + i} for i, v in enumerate(losses)]
    return {"run_name": "r", "world_size": 2, "device": "cpu", "resumes": [], "history": history,
            "options": {"data": data}, "vocab_size": 265, "tokens_per_s": 1001.0, **extra}  # fmt: skip


def test_smoothed_follows_a_constant_and_damps_noise():
    assert summary.smoothed([2.0] * 5, 3) == pytest.approx([2.0] * 5)
    noisy = [5.0 + (0.1 if i % 2 else -0.1) for i in range(40)]
    tail = summary.smoothed(noisy, 10)[-10:]
    assert max(tail) - min(tail) < 0.05  # the raw curve swings by 0.2


def test_chance_level_only_for_random_data():
    assert summary.chance_loss(_summary("random", [5.6])) == pytest.approx(math.log(265))
    assert summary.chance_loss(_summary("s3://bucket/prepared", [5.6])) is None


@pytest.mark.dev_packages  # matplotlib is not in the image (the run skips its plot there)
def test_plot_draws_chance_level_smoothed_curve_and_final_values(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    import matplotlib.axes

    labels: list[str] = []
    ylims: list[tuple] = []
    real_legend, real_ylim = matplotlib.axes.Axes.legend, matplotlib.axes.Axes.set_ylim

    def legend(self, *args, **kwargs):
        labels.extend(h.get_label() for h in self.get_legend_handles_labels()[0])
        return real_legend(self, *args, **kwargs)

    def set_ylim(self, *args, **kwargs):
        ylims.append(args)
        return real_ylim(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "legend", legend)
    monkeypatch.setattr(matplotlib.axes.Axes, "set_ylim", set_ylim)
    losses = [5.578 + 0.03 * ((i * 7) % 5) / 4 for i in range(40)]
    summary.plot(_summary("random", losses), str(tmp_path / "p.png"))
    assert (tmp_path / "p.png").stat().st_size > 0
    assert any(label.startswith("chance level ln(265) = 5.580 (random data)") for label in labels)
    assert any(label.startswith("smoothed (EMA, span 2); final ") for label in labels)
    assert any(f"last step {losses[-1]:.3f}" in label for label in labels)
    assert (
        0,
        pytest.approx(1.1 * max(losses)),
    ) in ylims  # the axis starts at 0: noise near ln(vocab) does not look like learning


def test_data_epochs_in_the_summary():
    meta = {"history": [], "position": 300, "data_sequences": 100}
    assert summary.summarize(meta, {"run_name": "r"}, 1.0)["data_epochs"] == 3.0
    assert summary.summarize({"history": [], "position": 300}, {"run_name": "r"}, 1.0)["data_epochs"] is None


def test_a_step_that_starts_another_pass_over_the_data_is_logged(capsys):
    fake = types.SimpleNamespace(blocks=[0] * 10, rank=0, step=3)
    Trainer._note_data_epochs(fake, 8, 12)  # type: ignore[arg-type]
    Trainer._note_data_epochs(fake, 12, 16)  # type: ignore[arg-type]
    Trainer._note_data_epochs(fake, 16, 40)  # type: ignore[arg-type]
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "[train] step 3: data epoch 2 begins: all 10 sequences of the prepared data were read, "
        "the run repeats them (reshuffled)",
        *(f"[train] step 3: data epoch {e} begins: all 10 sequences of the prepared data were read, "
          "the run repeats them (reshuffled)" for e in (3, 4)),
    ]  # fmt: skip
    fake.rank = 1
    Trainer._note_data_epochs(fake, 38, 42)  # type: ignore[arg-type]
    assert capsys.readouterr().out == ""  # rank 0 only
