"""The method as `rw train` drives it: evaluation without skills, RewardWeaver's fresh diagnosis batch,
the admitted evaluator, reference labels, controlled expansion, evaluator revision, rw analyze,
the learning-rate schedule, and the bad inputs of variants."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
from _util import SMALL_RUN, metrics_rows, overrides_with
from rewardweaver_fakes import traj

from rwcore import AdaptiveMethod, MethodSettings
from rwcore.arise.pool import SKILLS_BEGIN
from rwcore.method import Providers
from rwcore.rewardweaver import Capability, LabelledCase, acceptance_test
from rwcore.rewardweaver.admission import evaluator_name
from rwcore.trainer import cli, rank_rollouts
from rwcore.trainer.cli.command import _config_file
from rwcore.trainer.config import load_config
from rwcore.trainer.envs import NegotiationEnv
from rwcore.trainer.envs.base import RuleDef, rule_spec
from rwcore.trainer.envs.negotiation import rubrics, run_episode
from rwcore.trainer.envs.negotiation.annotator import annotate
from rwcore.trainer.envs.negotiation.cases import labelled_cases_by_rule
from rwcore.trainer.envs.negotiation.reflector import NegotiationReflector
from rwcore.trainer.trainer import Trainer, learning_rate
from rwcore.types import JudgeReport, RubricJudgment
from rwcore.verdict import Verdict

SMALL = overrides_with(SMALL_RUN, "rewardweaver.diagnosis_tasks=3")


def build(tmp_path, *overrides, steps=4, name="run") -> Trainer:
    trainer = Trainer(load_config(None, [*SMALL, f"train.steps={steps}", *overrides]), tmp_path / name, quiet=True)
    trainer.setup()
    return trainer


def test_held_out_evaluation_never_shows_skills_and_the_analysis_flag_is_labelled(tmp_path, monkeypatch):
    prompts: list[tuple[str, str]] = []
    real = rank_rollouts.run_episodes

    def recording(env, policy, jobs, system_prompt, *args, **kwargs):
        prompts.append((jobs[0][2].split("/")[0] if jobs else "", system_prompt))
        return real(env, policy, jobs, system_prompt, *args, **kwargs)

    monkeypatch.setattr(rank_rollouts, "run_episodes", recording)
    trainer = build(
        tmp_path, "train.method=arise", "pool.eta_low=0.99", "pool.eta_high=1.0", "train.eval_with_skills=on", steps=6
    )
    trainer.train()
    assert trainer.method.pool.active_skills()  # skills were active in training ...
    training = [p for label, p in prompts if label.startswith("s")]
    evaluation = [p for label, p in prompts if label == "eval"]
    assert any(SKILLS_BEGIN in p for p in training)
    with_skills = [p for p in evaluation if SKILLS_BEGIN in p]
    plain = [p for p in evaluation if SKILLS_BEGIN not in p]
    assert plain and all(p == trainer.env.system_prompt for p in plain)
    metrics = metrics_rows(tmp_path / "run")
    assert [r["step"] for r in metrics if r["kind"] == "eval"] == [0, 2, 4, 6]
    labelled = [r for r in metrics if r["kind"] == "eval_with_skills"]
    assert [r["step"] for r in labelled] == [0, 2, 4, 6] and len(with_skills) >= 1
    assert all("eval_with_skills/success_rate" in r and "eval/success_rate" not in r for r in labelled)


def test_rewardweaver_diagnoses_a_fresh_on_policy_batch_at_every_stage_boundary(tmp_path):
    trainer = build(tmp_path, "train.method=rewardweaver")
    seen = []
    update = trainer.method.weaver.update

    def recording(trajectories, reports=None, **kwargs):
        seen.append(([t.trajectory_id for t in trajectories], {t.policy_version for t in trajectories}, kwargs["step"]))
        return update(trajectories, reports, **kwargs)

    trainer.method.weaver.update = recording
    trainer.train()
    # boundaries after steps 2 and 4 (the one before step 0 ran in setup): 3 tasks x G=4, from the updated policy
    assert [(len(ids), versions, step) for ids, versions, step in seen] == [(12, {2}, 2), (12, {4}, 4)]
    assert all(tid.startswith(f"diagnosis{step}/") for ids, _, step in seen for tid in ids)  # not a training batch
    stages = json.loads((tmp_path / "run" / "reward_stages.json").read_text())
    assert [s["start_step"] for s in stages] == [0, 2, 4]


def test_the_admitted_evaluator_is_the_judge_that_scores_training(tmp_path):
    trainer = build(tmp_path, "train.method=rewardweaver", steps=1)
    library = trainer.method.weaver.library
    assert set(library.ids()) == set(rubrics.INITIAL_LIBRARY)
    assert trainer.method.providers.evaluator is trainer.judge
    assert {library[cid].evaluator for cid in library.ids()} == {evaluator_name(trainer.judge)}


def test_reference_labels_do_not_come_from_the_rule_being_admitted(monkeypatch):
    env = NegotiationEnv(seed=0, num_train=4, num_eval=2)
    honest = labelled_cases_by_rule(env, ["asks_budget_first"])["asks_budget_first"]
    # a broken rule: passes everything. Labels made from it would agree with it by construction.
    broken = RuleDef(**{**rubrics.RULES_BY_ID["asks_budget_first"].__dict__, "check": lambda s: (True, "")})
    monkeypatch.setitem(rubrics.RULES_BY_ID, "asks_budget_first", broken)
    again = labelled_cases_by_rule(env, ["asks_budget_first"])["asks_budget_first"]
    assert [(c.trajectory.trajectory_id, c.label) for c in again] == [
        (c.trajectory.trajectory_id, c.label) for c in honest
    ]
    assert {Verdict.PASS, Verdict.FAIL} <= {c.label for c in again}
    # the annotator reads the transcript and the scenario sheet, never the episode's private state
    for case in again[:10]:
        stripped = type(case.trajectory).from_dict(
            {**case.trajectory.to_dict(), "metadata": {"task": case.trajectory.metadata["task"]}}
        )
        assert annotate("asks_budget_first", stripped) == case.label
    from rwcore.judges import RuleJudge

    judge = RuleJudge({"asks_budget_first": lambda t: broken.check(rubrics.episode_state(t))[0]})
    report, entry = acceptance_test(
        Capability("asks_budget_first", "asks the budget before any offer", scored=False), judge, again
    )
    assert entry is None and any("collapsed" in reason for reason in report.reasons)


def test_the_annotator_agrees_with_every_rule_on_varied_episodes():
    """Two independent readings of each criterion - the rules (episode state) and the annotator
    (transcript) - agree on scripted, random and deliberately bad policies."""
    env = NegotiationEnv(seed=5)
    cases = labelled_cases_by_rule(env, list(rubrics.RULES_BY_ID), num_sources=4)
    for rule_id, items in cases.items():
        assert items
        for case in items:
            verdict = rubrics.RULES_BY_ID[rule_id].check(rubrics.episode_state(case.trajectory))[0]
            expected = Verdict.NA if verdict is None else (Verdict.PASS if verdict else Verdict.FAIL)
            assert case.label == expected, (rule_id, case.trajectory.transcript())


class PromptJudge:
    """A judge whose verdicts depend on the evaluator prompt: correct (the metadata label) once the prompt
    says "strict", inverted before - what an LLM evaluator with unclear instructions does."""

    evaluator_id = "fake:prompt-judge"

    def evaluate(self, trajectories, rubrics_):
        reports = []
        for t in trajectories:
            judgments = {}
            for rubric in rubrics_:
                label = t.metadata["verdicts"][rubric.rubric_id]
                if "strict" not in rubric.evaluator_prompt and label in (Verdict.PASS, Verdict.FAIL):
                    label = Verdict.FAIL if label == Verdict.PASS else Verdict.PASS
                judgments[rubric.rubric_id] = RubricJudgment(rubric.rubric_id, label)
            reports.append(JudgeReport(t.trajectory_id, judgments))
        return reports


class Reviser:
    def __init__(self):
        self.seen = []

    def revise_evaluator(self, rubric, disagreements):
        self.seen.append([t.trajectory_id for t, _, _ in disagreements])
        return "strict: " + rubric.criterion


def cases(cid, sources):
    out = []
    for source in sources:
        for j in range(6):
            label = Verdict.PASS if j % 2 else Verdict.FAIL
            out.append(LabelledCase(traj(f"{cid}-{source}-{j}", verdicts={cid: label}), label, source))
    return out


def test_a_rejected_candidate_is_revised_on_the_development_partition_and_retested_on_held_out():
    dev, heldout = cases("c", ["d1", "d2"]), cases("c", ["h1", "h2"])
    reviser = Reviser()
    report, entry = acceptance_test(
        Capability("c", "does c"), PromptJudge(), dev_cases=dev, heldout_cases=heldout, reviser=reviser
    )
    assert entry is not None and entry.capability.evaluator_prompt == "strict: does c"
    assert entry.capability.definition == "does c"  # semantics unchanged
    (shown,) = reviser.seen
    assert shown and all(tid.split("-")[1] in ("d1", "d2") for tid in shown)  # never a held-out case
    assert any("1 evaluator revision" in reason for reason in report.reasons)
    # without a reviser (or with zero revisions) the same candidate stays rejected
    assert acceptance_test(Capability("c", "does c"), PromptJudge(), dev_cases=dev, heldout_cases=heldout)[1] is None
    assert (
        acceptance_test(
            Capability("c", "does c"),
            PromptJudge(),
            dev_cases=dev,
            heldout_cases=heldout,
            reviser=Reviser(),
            max_revisions=0,
        )[1]
        is None
    )


def test_controlled_expansion_runs_at_stage_boundaries_and_the_history_keeps_admissions_and_rejections():
    """The initial library lacks ends_hopeless_negotiation and clear_actions: a policy that keeps asking on
    no-deal tasks fails in ways no admitted capability covers (it asks again where it should end, and repeats
    itself), the proposer finds both rules, admission tests them."""
    from rwcore.judges import RuleJudge
    from rwcore.trainer.method_setup import admit_library

    env = NegotiationEnv(seed=0, num_train=40, num_eval=4)
    judge = RuleJudge({rule.spec.rubric_id: rule.check for rule in env.rules()})
    library = admit_library(env, judge, list(rubrics.INITIAL_LIBRARY))
    cases_by_rule = env.labelled_cases_by_rule(
        ["ends_hopeless_negotiation", "clear_actions", "offers_bundle_when_wanted"]
    )
    # offers_bundle_when_wanted gets labels that do not fit it: its admission must fail and be recorded
    wrong = [
        LabelledCase(c.trajectory, Verdict.FAIL if c.label == Verdict.PASS else Verdict.PASS, c.source)
        if c.label != Verdict.NA
        else c
        for c in cases_by_rule["offers_bundle_when_wanted"]
    ]
    provided = {
        "ends_hopeless_negotiation": cases_by_rule["ends_hopeless_negotiation"],
        "clear_actions": cases_by_rule["clear_actions"],
        "offers_bundle_when_wanted": wrong,
    }

    class Proposer(NegotiationReflector):
        def propose_capabilities(self, failures, library_, max_new):
            found = super().propose_capabilities(failures, library_, max_new)
            return found + [rule_spec(rubrics.RULES_BY_ID["offers_bundle_when_wanted"])]

    tasks = {t.task_id: list(t.tags) for t in env.tasks("train")}
    method = AdaptiveMethod(
        "rewardweaver",
        tasks,
        MethodSettings(batch_size=4, group_size=1, min_support=2, success_sample=0, max_new_capabilities=3),
        Providers(
            library=library,
            attributor=env.attributor(),
            evaluator=judge,
            proposer=Proposer(env),
            acceptance_cases=lambda c: provided[c.capability_id],
        ),
    )
    no_deal = [t for t in env.tasks("train") if "no_deal" in t.tags and "bundle" not in t.tags][:4]
    asker = [run_episode(env, t, lambda obs: "ask", seed=1, trajectory_id=f"{t.task_id}/ask") for t in no_deal]
    method.adapt(-1, diagnosis=(asker, judge.evaluate(asker, library.rubrics())))
    record = method.weaver.history.stages[0]
    admitted = ("ends_hopeless_negotiation", "clear_actions")  # both fail 4 of 4: library order breaks the tie
    assert record.admitted == admitted and all(cid in library for cid in admitted)
    expansion = record.diagnosis["expansion"]
    assert expansion["triggers"][0]["kind"] == "unattributed" and expansion["triggers"][0]["trajectories"] == 4
    assert expansion["admitted"] == list(admitted)
    assert "offers_bundle_when_wanted" in expansion["rejected"] and "offers_bundle_when_wanted" not in library
    stages = method.reward_stages()
    assert stages[0]["admitted"] == list(admitted) and stages[0]["expansion"] == expansion


def test_rw_analyze_writes_appendix_e_and_g_tables_that_match_an_independent_computation(tmp_path):
    out = tmp_path / "run"
    # successes are rare for an untrained policy (about 1 in 140 episodes): 512 episodes a stage give each some
    assert (
        cli.main(
            [
                "train",
                "--out",
                str(out),
                "--quiet",
                *SMALL,
                "train.steps=8",
                "rollout.tasks_per_step=8",
                "rollout.group_size=32",
            ]
        )
        == 0
    )
    assert cli.main(["analyze", str(out)]) == 0
    folder = out / "analysis"
    for name in ("bottleneck", "retention"):
        assert (folder / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (folder / f"{name}.md").read_text().startswith("# ")
    table = json.loads((folder / "bottleneck.json").read_text())
    stages = json.loads((out / "reward_history.json").read_text())["stages"]
    ids = sorted({c for s in stages for c in s["diagnosis"]["failure_rates"]})  # expansion may add capabilities
    fail = np.array([[s["diagnosis"]["failure_rates"].get(c, np.nan) for c in ids] for s in stages])
    succ = np.array([[s["diagnosis"].get("success_rates", {}).get(c, np.nan) for c in ids] for s in stages])
    importance, reduction = (fail - succ)[:-1].ravel(), (fail[:-1] - fail[1:]).ravel()
    keep = np.isfinite(importance) & np.isfinite(reduction)
    assert table["summary"]["n_pairs"] == int(keep.sum()) > 0

    def ranks(x):  # average ranks, written out
        order = sorted(range(len(x)), key=lambda i: x[i])
        r = [0.0] * len(x)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and x[order[j + 1]] == x[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2 + 1
            i = j + 1
        return np.array(r)

    a, b = ranks(list(importance[keep])), ranks(list(reduction[keep]))
    rho = float(np.corrcoef(a, b)[0, 1]) if a.std() and b.std() else None
    assert (table["summary"]["importance_rho"] is None) == (rho is None)
    if rho is not None:
        assert abs(table["summary"]["importance_rho"] - rho) < 1e-9
    retention = json.loads((folder / "retention.json").read_text())
    assert set(retention["scores"]) == set(ids) and retention["stage_end_steps"] == [2, 4, 6, 8]
    points = {p["step"]: p["scores"] for p in json.loads((out / "diagnostics.json").read_text())}
    assert sorted(points) == [0, 2, 4, 6, 8]
    # a capability admitted by expansion has no score before it was in the library
    assert all(
        retention["scores"][c][k] == points[end].get(c)
        for c in ids
        for k, end in enumerate(retention["stage_end_steps"])
    )


def test_rw_analyze_explains_a_run_without_stages(tmp_path, capsys):
    assert (
        cli.main(["train", "--out", str(tmp_path / "a"), "--quiet", *SMALL, "train.steps=2", "train.method=arise"]) == 0
    )
    assert cli.main(["analyze", str(tmp_path / "a")]) == 2
    assert "reward_history.json" in capsys.readouterr().err


def test_learning_rate_warm_up_then_schedule_and_the_optimizer_follows(tmp_path):
    assert [learning_rate(k, 1.0, 4, "constant", 10) for k in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert learning_rate(4, 1.0, 4, "linear", 10) == 1.0 and learning_rate(7, 1.0, 4, "linear", 10) == 0.5
    assert abs(learning_rate(7, 1.0, 4, "cosine", 10) - 0.5) < 1e-12 and learning_rate(9, 2.0, 0, "cosine", 10) > 0
    trainer = build(tmp_path, "train.method=outcome_only", "optim.warmup_steps=2", "optim.lr=0.01", steps=3)
    trainer.train()
    assert [r["lr"] for r in metrics_rows(tmp_path / "run") if r["kind"] == "train"] == [0.005, 0.01, 0.01]
    assert trainer.engine.optimizer.param_groups[0]["lr"] == 0.01


def test_arise_frozen_rubrics_needs_a_usable_source_run(tmp_path, capsys):
    base = ["train", "--quiet", *SMALL, "train.steps=1", "train.method=arise_frozen_rubrics"]
    assert cli.main([base[0], "--out", str(tmp_path / "x"), *base[1:], f"pool.frozen_from={tmp_path / 'missing'}"]) == 2
    err = capsys.readouterr().err
    assert "'pool.frozen_from'" in err and "pool_rubrics.json" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()  # refused before anything was written
    assert (
        cli.main(
            ["train", "--quiet", "--out", str(tmp_path / "rw"), *SMALL, "train.steps=1", "train.method=rewardweaver"]
        )
        == 0
    )
    assert cli.main([base[0], "--out", str(tmp_path / "y"), *base[1:], f"pool.frozen_from={tmp_path / 'rw'}"]) == 2
    assert "pool_rubrics.json" in capsys.readouterr().err
    assert cli.main(["train", "--quiet", *SMALL, "train.steps=1", "pool.frozen_from=/x"]) == 2
    assert "only train.method=arise_frozen_rubrics uses it" in capsys.readouterr().err


def test_a_resumed_run_refuses_another_variant(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["train", "--out", str(out), "--quiet", *SMALL, "train.steps=2", "train.method=arise"]) == 0
    config = (out / "config.yaml").read_text()
    (out / "config.yaml").write_text(
        config.replace("method: arise", "method: arise_no_adaptive_sampling").replace(
            "kind: capability", "kind: uniform"
        )
    )
    before = {name: (out / name).read_bytes() for name in ("method.json", "metrics.jsonl")}
    assert cli.main(["train", "--resume", str(out)]) == 2
    assert "train.method" in capsys.readouterr().err
    assert {name: (out / name).read_bytes() for name in before} == before  # nothing half-applied


def test_import_of_the_kernels_loads_neither_the_extension_nor_the_algorithms():
    # rwcore._checkout (sys.path order when run from the checkout) and rwcore.settings (how a setting is declared) are
    # the other modules: both import the standard library only (and NumPy)
    code = (
        "import sys, rwcore.kernels; bad = [m for m in sys.modules if m.startswith('rwcore.') and not "
        "m.startswith('rwcore.kernels') and m not in ('rwcore._checkout', 'rwcore.settings')]; print(bad)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_import_of_the_method_loads_neither_torch_nor_the_kernels():
    # the method and its settings are plain Python and NumPy: a sampler or a trainer driver that uses them alone
    # does not pay for torch and Triton
    code = (
        "import sys, rwcore.method; print(sorted(m for m in ('torch', 'triton', 'rwcore.kernels') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_shipped_configs_load_by_name_and_hold_the_papers_settings(capsys):
    arise = load_config(_config_file("arise-qwen"))
    # Arise appendix B.2, table 2
    assert (
        arise.rollout.tasks_per_step,
        arise.rollout.group_size,
        arise.optim.lr,
        arise.optim.warmup_steps,
        arise.optim.schedule,
        arise.model.dtype,
        arise.train.steps,
    ) == (32, 8, 2e-6, 40, "constant", "bfloat16", 150)
    assert (
        arise.advantage.lam,
        arise.pool.delta_pool,
        arise.pool.eta_low,
        arise.pool.eta_high,
        arise.pool.max_pool,
        arise.pool.max_new,
        arise.rollout.temperature,
    ) == (0.3, 10, 0.3, 0.9, 64, 8, 1.0)
    assert arise.train.method == "arise" and not hasattr(arise.sampler, "kind")  # the variant says which sampler
    weaver = load_config(_config_file("rewardweaver-qwen"))
    assert (weaver.rewardweaver.budget, weaver.rewardweaver.adaptation_interval) == (6, 30)
    assert weaver.train.method == "rewardweaver"
    assert load_config(_config_file("default")) == load_config()  # the embedded default, spelled out
    assert cli.main(["config", "--list"]) == 0
    assert {"default", "arise-qwen", "rewardweaver-qwen"} <= {
        line.split()[0] for line in capsys.readouterr().out.splitlines()
    }
    assert cli.main(["config", "--config", "no-such-config"]) == 2
    assert "shipped: " in capsys.readouterr().err


def test_rw_train_drives_the_method_through_the_shared_loop_in_its_order(tmp_path, monkeypatch):
    from rwcore.method.loop import MethodLoop

    calls = []
    for name in ("plan", "finish", "end_step"):
        real = getattr(MethodLoop, name)

        def recording(self, *args, _real=real, _name=name, **kwargs):
            calls.append(_name)
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(MethodLoop, name, recording)
    trainer = build(tmp_path, "train.method=combined")
    real_update = trainer._update_policy

    def update(*args, **kwargs):
        calls.append("update")
        return real_update(*args, **kwargs)

    trainer._update_policy = update
    calls.clear()
    trainer.train_step()
    trainer.train_step()
    assert calls == ["plan", "finish", "update", "end_step"] * 2
    assert trainer.loop.method is trainer.method and trainer.loop.pending_end_step is None
