"""`model.name=<local path>`: a saved Hugging Face causal LM with its own tokenizer and chat template.

Nothing is downloaded: the test saves a tiny random Llama and a word-level tokenizer with a chat
template to a folder, and trains from that folder through the same path a real model takes.
"""

from __future__ import annotations

import json

import torch
from _util import save_tiny_chat_model

from rwcore.trainer.config import load_config
from rwcore.trainer.trainer import Trainer


def test_trains_a_saved_model_through_its_chat_template(tmp_path):
    save_tiny_chat_model(tmp_path / "model")
    overrides = [
        f"model.name={tmp_path / 'model'}",
        "train.method=arise",
        "train.steps=2",
        "rollout.tasks_per_step=2",
        "rollout.group_size=2",
        "env.options.num_train=10",
        "env.options.num_eval=4",
        "train.eval_every=0",
        "train.checkpoint_every=0",
        "pool.delta_pool=2",
    ]
    trainer = Trainer(load_config(None, overrides), tmp_path / "run", quiet=True)
    trainer.setup()
    before = {k: v.clone() for k, v in trainer.policy.model.state_dict().items()}
    trainer.train()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "train"] == [1, 2]
    changed = any(not torch.equal(before[k], v) for k, v in trainer.policy.model.state_dict().items())
    assert changed  # the update reached the saved model's weights
    rollouts, _ = trainer._rollout(trainer.method.sample(2), 2, "s2", trainer.env.system_prompt)
    text = trainer.policy.codec.decode(rollouts[0].token_ids)
    assert "item" in text  # the task brief went through the chat template
    assert any(rollouts[0].generated) and rollouts[0].behavior_logprobs.abs().sum() > 0
