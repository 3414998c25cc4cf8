"""The skill-reading probe (rwcore.trainer.prior.probe) against a rule-based reader.

The stand-in model reads its input ids back into words and, at each position, puts all its probability on
the move of the guidance line (parsed from the skills section) whose situation the latest observation
shows, or spreads it evenly over the moves when none does. The probe must then report exactly that: the
hinted move at probability 1 with its line, at 1/8 without it or among distractors only; every skill text
lifted by 7/8.
"""

import types

import pytest
import torch

from rwcore.trainer.envs.negotiation import NegotiationEnv, situation_of
from rwcore.trainer.policy import WordCodec
from rwcore.trainer.prior.corpus import CorpusSpec, parse_guidance
from rwcore.trainer.prior.probe import format_probe, probe

ENV = NegotiationEnv()
LANGUAGE = ENV.guidance_language()
CODEC = WordCodec(ENV.vocabulary())


class RuleReader(torch.nn.Module):
    """An HF-causal-LM-shaped module (`.model(...)`, `.lm_head`, `.config`) that reads by rule."""

    def __init__(self, codec):
        super().__init__()
        size = len(codec)
        self.codec = codec
        self.lm_head = torch.nn.Linear(size, size, bias=False)
        with torch.no_grad():
            self.lm_head.weight.copy_(torch.eye(size))
        # a sliding window keeps Policy.hidden_states on the plain path (no shared-prefix cache)
        self.config = types.SimpleNamespace(vocab_size=size, sliding_window=4096)
        self.model = self._backbone

    def _backbone(self, input_ids, attention_mask=None, **kwargs):
        batch, length = input_ids.shape
        hidden = torch.zeros(batch, length, len(self.codec))
        hidden[:, :, self.codec.end_id] = -30.0  # never <end>: "uniform" is 1/8 over the moves
        for row in range(batch):  # it answers at each row's last token only: the probe must ask there
            ids = input_ids[row].tolist()
            t = (int(attention_mask[row].sum()) if attention_mask is not None else length) - 1
            move = self._read(ids[: t + 1])
            if move is not None:
                hidden[row, t, self.codec.vocab[move]] = 30.0
        return types.SimpleNamespace(last_hidden_state=hidden)

    def _read(self, ids):
        vocab = self.codec.vocab
        if vocab["<partner>"] not in ids:
            return None
        first = ids.index(vocab["<partner>"])
        last = len(ids) - 1 - ids[::-1].index(vocab["<partner>"])
        observation = self.codec.decode([i for i in ids[last + 1 :] if i != vocab["<assistant>"]])
        situation = situation_of(observation)
        chunks, chunk = [], []
        for token in ids[2:first]:  # the system prompt; <unk> stands for the markers and preamble words
            if token == vocab["<unk>"]:
                chunks.append(chunk)
                chunk = []
            else:
                chunk.append(token)
        chunks.append(chunk)
        for chunk in chunks:
            pair = parse_guidance(self.codec.decode(chunk), LANGUAGE)
            if pair is not None and pair[0] == situation:
                return pair[1]
        return None


@pytest.fixture(scope="module")
def report():
    return probe(RuleReader(CODEC), CODEC, ENV, LANGUAGE, CorpusSpec())


def test_heldout_pairings_of_a_perfect_reader(report):
    heldout = report["heldout"]
    assert report["chance"] == pytest.approx(1 / 8)
    assert heldout["with"] == pytest.approx(1.0, abs=1e-6)
    assert heldout["without"] == pytest.approx(1 / 8, abs=1e-6)
    assert heldout["distractors_only"] == pytest.approx(1 / 8, abs=1e-6)
    assert len(heldout["pairs"]) == 12


def test_skill_texts_of_a_perfect_reader(report):
    summary = report["skills_summary"]
    assert summary["probed"] == 30 and summary["not_probed"] == 3
    for skill in report["skills"]:
        if skill["probed"]:
            assert skill["contexts"] == 24
            assert skill["with"] == pytest.approx(1.0, abs=1e-6) and skill["lift"] == pytest.approx(7 / 8, abs=1e-6)
            assert skill["among_all_skills"] == pytest.approx(1.0, abs=1e-6)
        else:
            assert skill["text"] in (
                "use one clear move each turn",
                "never repeat a move the buyer answered",
                "say each move once",
            )
    text = format_probe(report)
    assert "P(hinted move) 1.000 with the guidance line, 0.125 without it" in text
    assert "lift min +0.875" in text and "(not probed)  say each move once" in text


def test_a_reader_that_ignores_guidance_gets_no_lift():
    class Deaf(RuleReader):
        def _read(self, ids):
            return None

    report = probe(Deaf(CODEC), CODEC, ENV, LANGUAGE, CorpusSpec())
    assert report["heldout"]["with"] == pytest.approx(1 / 8, abs=1e-6)
    assert report["skills_summary"]["min_lift"] == pytest.approx(0.0, abs=1e-6)
    assert report["skills_summary"]["mean_lift"] == pytest.approx(0.0, abs=1e-6)
