"""env.name=tasks without a model: task files checked row by row (FILE:LINE:FIELD), the outcome function's spec,
arguments and return values, the rubrics file, the multi-turn opening as the codecs encode it, and provenance.

Each test writes its own files and its own reward module (a unique module name, on sys.path for the test)."""

from __future__ import annotations

import hashlib
import json
import uuid

import pytest

from rwcore.judges import RuleJudge
from rwcore.trainer.envs import make
from rwcore.trainer.envs.tasks import TaskFileEnv, UserFunctionError
from rwcore.trainer.rollout import Rollout
from rwcore.types import Trajectory, Turn
from rwcore.verdict import Verdict

GOOD = [
    {"id": "a", "prompt": "the buyer wants the lamp", "metadata": {"answer": "lamp"}, "tags": ["furniture"]},
    {"id": "b", "prompt": "the buyer wants the phone", "metadata": {"answer": "phone"}},
]
EVAL = [{"id": "e", "prompt": "the seller has the desk", "metadata": {"answer": "desk"}, "tags": ["furniture"]}]
REWARDS = """
def score(completion, metadata):
    return 1.0 if metadata["answer"] in completion.split() else 0.0

def graded(completion):
    return 0.25

def pair(completion):
    return 0.5, True

def flag(completion):
    return completion == "yes"

def boom(completion, task_id):
    if task_id == "b":
        raise ZeroDivisionError("division by zero")
    return 1.0

def text(completion):
    return "high"

def too_big(completion):
    return 1.5

def nan(completion):
    return float("nan")

def everything(**kwargs):
    SEEN.append(kwargs)
    kwargs["metadata"]["answer"] = "changed"  # the environment hands out a copy
    return 1.0

def extra(completion, gold):
    return 1.0

def nothing():
    return 1.0

def names_lamp(completion):
    return "lamp" in completion.split()

def short(completion):
    return len(completion.split()) <= 2

def maybe(completion):
    return "maybe"

SEEN = []
NOT_A_FUNCTION = 3
"""


def _jsonl(path, rows) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


@pytest.fixture
def module(tmp_path, monkeypatch):
    """A reward module with a name of its own (sys.modules caches modules by name) on sys.path."""
    name = f"rewards_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def _env(tmp_path, module, train=GOOD, evals=EVAL, **options):
    options.setdefault("reward", f"{module}:score")
    return make(
        "tasks",
        train_file=_jsonl(tmp_path / "train.jsonl", train),
        eval_file=_jsonl(tmp_path / "eval.jsonl", evals),
        **options,
    )


def _play(env, task, completion):
    episode = env.reset(task, 0)
    episode = env.step(episode, completion)
    assert episode.done
    return env.outcome(episode)


USER = {"role": "user", "content": "x"}
BAD_ROWS = [
    ("{not json", "3", "not JSON"),
    ('["a", "list"]', "3", "a row is a JSON object"),
    ({"id": "c", "prompt": "x", "answer": "y"}, "3:answer", "not a task field"),
    ({"id": "c"}, "3:prompt", "exactly one of prompt"),
    ({"id": "c", "prompt": "x", "messages": [{"role": "user", "content": "x"}]}, "3:prompt", "exactly one"),
    ({"id": "c", "prompt": "  "}, "3:prompt", "non-empty string"),
    ({"id": 7, "prompt": "x"}, "3:id", "non-empty string"),
    ({"id": "a", "prompt": "x"}, "3:id", "duplicate id 'a' (first on line 1)"),
    ({"id": "c", "prompt": "x", "metadata": [1]}, "3:metadata", "a JSON object"),
    ({"id": "c", "prompt": "x", "tags": "furniture"}, "3:tags", "a list of 1 to 32"),
    ({"id": "c", "prompt": "x", "tags": []}, "3:tags", "a list of 1 to 32"),
    ({"id": "c", "messages": []}, "3:messages", "a non-empty list"),
    ({"id": "c", "messages": [{"role": "system", "content": "x"}]}, "3:messages[0].role", "env.options.system_prompt"),
    ({"id": "c", "messages": [USER, {"role": "user", "content": "y"}]}, "3:messages[1].role", "alternates"),
    ({"id": "c", "messages": [USER, {"role": "assistant", "content": "y"}]}, "3:messages", "ends with a user"),
    ({"id": "c", "messages": [{"role": "user", "text": "x"}]}, "3:messages[0]", "exactly the keys role and content"),
]  # fmt: skip


@pytest.mark.parametrize(("row", "where", "says"), BAD_ROWS)
def test_a_bad_row_is_refused_naming_file_line_and_field(tmp_path, module, row, where, says):
    with pytest.raises(ValueError) as caught:
        _env(tmp_path, module, train=[*GOOD, row])
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / 'train.jsonl'}:{where}: "), message
    assert says in message and "\n" not in message


def test_every_file_is_checked_before_anything_is_used(tmp_path, module):
    # the eval file's row 2 is bad: the environment is not built at all (nothing half-read), the error names it
    with pytest.raises(ValueError, match=rf"^{tmp_path / 'eval.jsonl'}:2:tags: "):
        _env(tmp_path, module, evals=[*EVAL, {"prompt": "x", "tags": [""]}])
    with pytest.raises(ValueError, match=r"env.options.train_file: .* holds no task"):
        _env(tmp_path, module, train=["", "   "])
    with pytest.raises(ValueError, match=r"env.options.eval_file: .* is not a file"):
        make(
            "tasks", train_file=_jsonl(tmp_path / "t.jsonl", GOOD), eval_file=str(tmp_path / "nope.jsonl"), reward="m:f"
        )
    with pytest.raises(ValueError, match=r"eval.jsonl:1:id: task id 'a' is also in env.options.train_file"):
        _env(tmp_path, module, evals=[GOOD[0]])
    with pytest.raises(ValueError, match=r"env.options.eval_file: env.name=tasks needs it"):
        make("tasks", train_file=_jsonl(tmp_path / "t.jsonl", GOOD), reward=f"{module}:score")
    with pytest.raises(ValueError, match=r"config key 'env.options.train_files'.*its options: train_file, eval_file"):
        make("tasks", train_files="x")


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("", "env.options.reward: env.name=tasks needs it"),
        ("score", "name the function as 'module:function'"),
        ("a:b:c", "name the function as 'module:function'"),
        ("no_such_module_xyz:score", "cannot import module 'no_such_module_xyz'"),
        ("{m}:missing", "has no attribute 'missing'"),
        ("{m}:NOT_A_FUNCTION", "'NOT_A_FUNCTION' is a int, not a function"),
        ("{m}:extra", "its parameter 'gold' is not one rwcore passes"),
        ("{m}:nothing", "takes none of completion, messages, metadata, task_id, tags"),
    ],
)
def test_a_bad_reward_spec_is_refused_when_the_environment_is_built(tmp_path, module, spec, says):
    with pytest.raises(ValueError) as caught:
        _env(tmp_path, module, reward=spec.format(m=module))
    assert says in str(caught.value) and "env.options.reward" in str(caught.value)


def test_the_reward_sees_the_reply_and_the_row_and_its_values_become_the_outcome(tmp_path, module):
    env = _env(tmp_path, module)
    assert isinstance(env, TaskFileEnv) and env.max_turns == 1
    assert [t.task_id for t in env.tasks("train")] == ["a", "b"] and [t.task_id for t in env.tasks("eval")] == ["e"]
    assert env.tasks("train")[0].tags == ("furniture",) and env.tasks("train")[1].tags == ("untagged",)
    lamp = env.tasks("train")[0]
    assert env.reset(lamp, 0).observation == "the buyer wants the lamp"
    assert (_play(env, lamp, "say lamp").reward, _play(env, lamp, "say lamp").success) == (1.0, True)
    assert (_play(env, lamp, "say desk").reward, _play(env, lamp, "say desk").success) == (0.0, False)
    for function, completion, expected in (
        ("graded", "x", (0.25, False)),  # below the success threshold (1.0)
        ("pair", "x", (0.5, True)),
        ("flag", "yes", (1.0, True)),
        ("flag", "no", (0.0, False)),
    ):
        outcome = _play(_env(tmp_path, module, reward=f"{module}:{function}"), lamp, completion)
        assert (outcome.reward, outcome.success) == expected, function
    graded = _env(tmp_path, module, reward=f"{module}:graded", success_threshold=0.2)
    assert _play(graded, lamp, "x").success is True


def test_a_reward_that_raises_or_returns_a_non_number_stops_naming_the_function_and_the_task(tmp_path, module):
    train = _jsonl(tmp_path / "train.jsonl", GOOD)
    for function, says in (
        ("boom", "raised ZeroDivisionError on task 'b' ({}:2): division by zero"),
        ("text", "returned 'high' (str) on task 'b' ({}:2)"),
        ("too_big", "returned 1.5 on task 'b' ({}:2); a reward lies in [0, 1]"),
        ("nan", "returned nan (float) on task 'b' ({}:2)"),
    ):
        env = _env(tmp_path, module, reward=f"{module}:{function}")
        with pytest.raises(UserFunctionError) as caught:
            _play(env, env.tasks("train")[1], "say phone")
        expected = f"env.options.reward '{module}:{function}' " + says.format(train)
        assert str(caught.value).startswith(expected) and "\n" not in str(caught.value), caught.value


def test_a_multi_turn_opening_reaches_the_reward_and_both_codecs(tmp_path, module):
    import importlib

    opening = [
        {"role": "user", "content": "the buyer wants the lamp"},
        {"role": "assistant", "content": "ask the price"},
        {"role": "user", "content": "no name the item"},
    ]
    env = _env(
        tmp_path,
        module,
        train=[{"id": "m", "messages": opening, "metadata": {"answer": "lamp"}}],
        reward=f"{module}:everything",
    )
    task = env.tasks("train")[0]
    assert env.opening(task) == [("partner", "the buyer wants the lamp"), ("assistant", "ask the price")]
    assert env.reset(task, 0).observation == "no name the item"
    assert _play(env, task, "lamp").reward == 1.0
    seen = importlib.import_module(module).SEEN[-1]
    assert seen == {
        "completion": "lamp",
        "messages": [*opening, {"role": "assistant", "content": "lamp"}],
        "metadata": {"answer": "changed"},
        "task_id": "m",
        "tags": ["untagged"],
    }
    assert _play(env, task, "lamp").reward == 1.0 and importlib.import_module(module).SEEN[-1]["metadata"] == {
        "answer": "changed"
    }  # a fresh copy each call: the row's own metadata is unchanged
    assert env._rows["m"].metadata == {"answer": "lamp"}

    from rwcore.trainer.policy import TemplateCodec, WordCodec

    codec = WordCodec(["the", "buyer", "wants", "lamp", "ask", "price", "no", "name", "item", "be", "brief"])
    ids = codec.start("be brief", "no name the item", env.opening(task))
    expected = "<bos> <system> be brief <partner> the buyer wants the lamp <assistant> ask the price <end> "
    expected += "<partner> no name the item <assistant>"
    assert ids == [codec.vocab[t] for t in expected.split()]

    class Template:  # the chat template's rendering, as transformers' apply_chat_template gives it (text only)
        chat_template = "x"
        eos_token_id = pad_token_id = 0

        def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
            return "".join(f"<{m['role']}>{m['content']}" for m in messages) + ("<go>" if add_generation_prompt else "")

        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": [text]}

    rendered = TemplateCodec(Template()).start("be brief", "no name the item", env.opening(task))
    assert rendered == [
        "<system>be brief<user>the buyer wants the lamp<assistant>ask the price<user>no name the item<go>"
    ]


def test_rubrics_with_checks_are_rules_the_rule_judge_and_providers_use(tmp_path, module):
    rubrics = tmp_path / "rubrics.yaml"
    rubrics.write_text(
        "rubrics:\n"
        f"  - {{id: names_lamp, criterion: The reply names the lamp., capability: Understanding,"
        f" check: '{module}:names_lamp'}}\n"
        f"  - {{id: short, criterion: At most two words., skill: be brief, check: '{module}:short'}}\n"
        f"  - {{id: odd, criterion: Returns maybe., check: '{module}:maybe'}}\n"
    )
    env = _env(tmp_path, module, rubrics=str(rubrics))
    rules = env.rules()
    assert [(r.spec.rubric_id, r.spec.capability, r.family) for r in rules] == [
        ("names_lamp", "Understanding", "understanding"),
        ("short", "Execution", "execution"),
        ("odd", "Execution", "execution"),
    ]
    assert env.reflector() is not None and env.attributor() is not None
    assert [s.rubric_id for s in env.capability_candidates()] == ["names_lamp", "short", "odd"]
    trajectory = Trajectory(
        task_id="a",
        turns=[
            Turn("system", ""),
            Turn("partner", "the buyer wants the lamp"),
            Turn("assistant", "the lamp please", generated=True),
        ],
        outcome=1.0,
        trajectory_id="t0",
        metadata={"env_state": {"completion": "the lamp please"}},
    )
    judge = RuleJudge({r.spec.rubric_id: r.check for r in rules})
    verdicts = judge.evaluate([trajectory], [r.spec for r in rules])[0].judgments
    assert verdicts["names_lamp"].verdict == Verdict.PASS and verdicts["short"].verdict == Verdict.FAIL
    # a check that returns something else is an INVALID verdict naming it (the judge's contract), not a crash
    assert verdicts["odd"].verdict == Verdict.INVALID and "returned 'maybe' (str) on task 'a'" in verdicts["odd"].error


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("- {id: x, criterion: y}\n", "the file holds one key, rubrics"),
        ("rubrics: []\n", "rubrics: the list is empty"),
        ("rubrics:\n  - {id: x}\n", "rubrics[0].criterion: missing"),
        ("rubrics:\n  - {id: x, criterion: y, weight: 2}\n", "rubrics[0].weight: not a rubric field"),
        ("rubrics:\n  - {id: 'a b', criterion: y}\n", "rubrics[0].id: letters, digits"),
        ("rubrics:\n  - {id: x, criterion: y}\n  - {id: x, criterion: z}\n", "rubrics[1].id: duplicate rubric id 'x'"),
        (
            "rubrics:\n  - {id: x, criterion: y, check: 'nope_mod_q:f'}\n",
            "rubrics[0].check 'nope_mod_q:f': cannot import",
        ),
        (
            "rubrics:\n  - {id: x, criterion: y, check: '{m}:short'}\n  - {id: z, criterion: w}\n",
            "rubric 'z' has no check",
        ),
        ("rubrics: [\n", "is not valid YAML/JSON"),
    ],
)
def test_a_bad_rubrics_file_is_refused_naming_the_entry_and_field(tmp_path, module, text, says):
    rubrics = tmp_path / "rubrics.yaml"
    rubrics.write_text(text.replace("{m}", module))
    with pytest.raises(ValueError) as caught:
        _env(tmp_path, module, rubrics=str(rubrics))
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_without_rubrics_the_environment_provides_no_rules_and_candidates(tmp_path, module):
    env = _env(tmp_path, module)
    assert env.rules() is None and env.reflector() is None and env.capability_candidates() is None


def test_provenance_is_the_sha256_of_the_reward_module_and_both_files(tmp_path, module):
    env = _env(tmp_path, module)
    digest = {
        name: hashlib.sha256((tmp_path / name).read_bytes()).hexdigest() for name in ("train.jsonl", "eval.jsonl")
    }
    assert env.provenance() == {
        f"reward module {module}": hashlib.sha256(REWARDS.encode()).hexdigest(),
        f"train_file {tmp_path.resolve() / 'train.jsonl'}": digest["train.jsonl"],
        f"eval_file {tmp_path.resolve() / 'eval.jsonl'}": digest["eval.jsonl"],
    }


def test_a_parquet_task_file_reads_like_jsonl_and_its_bad_row_is_named_by_number(tmp_path, module):
    import pyarrow as pa  # in the test set-up: the integrations extra's TRL brings datasets, which needs it
    import pyarrow.parquet as pq

    rows = [{"id": "p1", "prompt": "the buyer wants the lamp", "metadata": {"answer": "lamp"}, "tags": ["furniture"]}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    env = make(
        "tasks",
        train_file=str(tmp_path / "train.parquet"),
        eval_file=_jsonl(tmp_path / "eval.jsonl", EVAL),
        reward=f"{module}:score",
    )
    task = env.tasks("train")[0]
    assert (task.task_id, task.tags, _play(env, task, "lamp").reward) == ("p1", ("furniture",), 1.0)
    bad = [*rows, {"id": "p2", "prompt": "x", "metadata": {"answer": "y"}, "tags": ["t", ""]}]
    pq.write_table(pa.Table.from_pylist(bad), tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match=rf"^{tmp_path / 'bad.parquet'}:2:tags: "):
        make(
            "tasks",
            train_file=str(tmp_path / "bad.parquet"),
            eval_file=str(tmp_path / "eval.jsonl"),
            reward=f"{module}:score",
        )


def test_the_transcript_of_an_episode_is_json_with_its_turns():
    from rwcore.trainer.envs.base import Outcome
    from rwcore.trainer.transcripts import transcript_of

    trajectory = Trajectory(
        task_id="a", turns=[Turn("partner", "hi"), Turn("assistant", "lamp", generated=True)], outcome=1.0, tags=("x",)
    )
    row = transcript_of(Rollout(trajectory, Outcome(1.0, True, "why"), [], []))
    assert json.loads(json.dumps(row)) == {
        "task_id": "a",
        "tags": ["x"],
        "reward": 1.0,
        "success": True,
        "reason": "why",
        "turns": [{"role": "partner", "content": "hi"}, {"role": "assistant", "content": "lamp", "generated": True}],
    }
