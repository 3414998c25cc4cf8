"""`VerifiersEnv`: a verifiers v1 taskset (and the verifiers Env that plays it) as an `rw train` environment
(see the package docstring)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from rwcore.trainer.envs.base import Episode, Outcome, Rule, Task, own_random, partner_failed
from rwcore.trainer.envs.verifiers import rubrics
from rwcore.trainer.envs.verifiers.bounds import MAX_NAME, cut, message_text
from rwcore.trainer.envs.verifiers.bridge import Bridge, run_all
from rwcore.trainer.envs.verifiers.episode import _TERMINATE, EnvironmentFault, EpisodeRun, SetupError
from rwcore.trainer.envs.verifiers.package import _import_verifiers, _offline_nltk, _warn_version

_SEAT_NAMES = ("agent", "assistant", "player", "solver", "policy")
_SELECT_KEYS = ("include", "exclude", "shuffle", "seed", "skip", "limit")
_MAX_SCORES = 256  # reward and metric names kept per episode (the weighted reward sums them all)
_MAX_REASON = 500  # characters of a partner failure's reason


class _Starting(Episode):
    """A reset episode whose environment is still starting in its thread: its observation, done, state and
    partner_failure are read from the started episode when first asked for. rw train resets a batch's episodes one after
    the other before it reads any observation; reading late lets their environments start together, so
    environments that hang at their start cost one env.options.timeout per batch, not one per episode."""

    def __init__(self, task: Task, settle) -> None:
        # not Episode's own __init__: observation, done, state and partner_failure are properties, read from `settle()`
        self.task = task
        self._settle = settle
        self._settled: Episode | None = None

    def _ready(self) -> Episode:
        if self._settled is None:
            self._settled = self._settle()
        return self._settled

    @property
    def observation(self) -> str:
        return self._ready().observation

    @property
    def done(self) -> bool:
        return self._ready().done

    @property
    def state(self) -> dict:
        return self._ready().state

    @property
    def partner_failure(self) -> str:
        return self._ready().partner_failure


def _field(data: Mapping, path: str):
    value = data
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            raise KeyError(part)
        value = value[part]
    return value


class VerifiersEnv:
    """env.name=verifiers. Options (env.options.*), see the package docstring:

    taskset: the verifiers taskset id (an installed package or a `verifiers.v1.tasksets` built-in, e.g.
        "textarena"); taskset_options: its config fields (e.g. {game: Hangman-v0}); env_id: a verifiers Env to
        pair with it (default: the taskset's own, else verifiers' SingleAgentEnv); env_options: that Env's
        config fields (e.g. a user simulator's persona); agent: the seat rwcore's policy plays (default: the
        only seat, else the one named agent / assistant / player / solver / policy).
    train / eval: verifiers select views (include, exclude, shuffle, seed, skip, limit) for the two splits;
        default eval = the first num_eval tasks, train = the next num_train (num_train 64, num_eval 16).
        The splits must not share a task (task.key).
    tag_field: a dotted TaskData field whose value is each task's type tag (e.g. info.game); default: one tag,
        the taskset id.
    reward_range: [low, high] of the environment's weighted reward (trace.reward, what verifiers trains on);
        rwcore's outcome in [0, 1] is (reward - low) / (high - low), clipped. success_threshold: success when
        trace.reward >= it (default: high).
    max_turns: the agent's turns per episode (default: its AgentConfig.max_turns, else 8); timeout: seconds
        (wall clock) each episode's environment may take from the moment it gets the turn (its start, or the
        agent's message) until it asks for the agent's next message or ends, scoring included (default
        120); an episode past it is abandoned, a partner failure, and the other episodes go on.
    system_prompt: the policy's base system prompt (default: the tasks' common TaskData.system_prompt; when
        tasks differ, each task's own goes at the head of its first observation).
    vocabulary / actions: extra words for the built-in word-level policy / the words it may say (optional).
    partner_*: the LLM partner that plays the other seats of a multi-seat Env (as env.name=textarena's).
    """

    name = "verifiers"

    def __init__(
        self,
        taskset: str = "",
        taskset_options: Mapping | None = None,
        env_id: str = "",
        env_options: Mapping | None = None,
        agent: str = "",
        train: Mapping | None = None,
        eval: Mapping | None = None,  # the split's name
        num_train: int = 64,
        num_eval: int = 16,
        tag_field: str = "",
        reward_range: Sequence[float] = (0.0, 1.0),
        success_threshold: float | None = None,
        max_turns: int | None = None,
        timeout: float = 120.0,
        system_prompt: str | None = None,
        vocabulary: Sequence[str] = (),
        actions: Sequence[str] = (),
        partner_model: str = "",
        partner_base_url: str = "",
        partner_api_key_env: str = "OPENAI_API_KEY",
        partner_timeout: float = 60.0,
        partner_max_tokens: int = 256,
        partner_temperature: float = 0.7,
        partner_max_concurrency: int = 8,
        partner_reply_format: str = "text",
        partner_max_reply_chars: int = 600,
    ) -> None:
        self._vf = _import_verifiers()
        _warn_version()
        if not isinstance(taskset, str) or not taskset:
            raise ValueError(
                "env.options.taskset: name the verifiers taskset to load (an installed taskset package or a "
                "verifiers built-in such as 'textarena'), e.g. env.options.taskset=my_taskset"
            )
        for key, value in (("num_train", num_train), ("num_eval", num_eval)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"env.options.{key}: must be a positive integer, got {value!r}")
        low, high = self._range(reward_range)
        threshold = high if success_threshold is None else float(success_threshold)
        if not math.isfinite(threshold):
            raise ValueError(f"env.options.success_threshold: must be a finite number, got {success_threshold!r}")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ValueError(f"env.options.timeout: must be a positive number of seconds, got {timeout!r}")
        self.taskset_id = taskset
        self.reward_low, self.reward_high, self.success_threshold = low, high, threshold
        self.tag_field = tag_field
        _offline_nltk()
        self.env = self._load_env(taskset, dict(taskset_options or {}), env_id, dict(env_options or {}))
        self.seat = self._seat(agent)
        self._check_task_class()
        seat_config = dict(self._seats())[self.seat]
        if max_turns is None:
            max_turns = seat_config.max_turns or 8
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
            raise ValueError(f"env.options.max_turns: must be a positive integer, got {max_turns!r}")
        self.max_turns = max_turns
        partner = None
        others = [name for name, _ in self._seats() if name != self.seat]
        if others:
            if not partner_model:
                raise ValueError(
                    f"env.options.partner_model: the verifiers environment {self.env_label!r} has seats {others} "
                    f"besides the trained one ({self.seat!r}); an LLM partner plays them - set partner_model (and "
                    "partner_base_url)"
                )
            from rwcore.trainer.envs.llm_partner import make_partner

            partner = make_partner(
                "llm",
                model=partner_model,
                base_url=partner_base_url,
                api_key_env=partner_api_key_env,
                argument="env.options.partner_model",
                timeout=partner_timeout,
                max_tokens=partner_max_tokens,
                temperature=partner_temperature,
                max_concurrency=partner_max_concurrency,
                reply_format=partner_reply_format,
                max_reply_chars=partner_max_reply_chars,
            )
        self._splits = self._load_splits(train, eval, num_train, num_eval)
        prompts = {t.data.get("system_prompt") or "" for split in self._splits.values() for t in split}
        self._shared_prompt = system_prompt is None and len(prompts) == 1
        self.system_prompt = (
            system_prompt if system_prompt is not None else (prompts.pop() if len(prompts) == 1 else "")
        )
        self._extra_words = [str(w) for w in vocabulary]
        self._actions = [str(w).lower() for w in actions]
        if self._actions:  # the built-in policy then says only these words (rollout.action_words=auto)
            self.action_vocabulary = lambda: list(self._actions)
        self._bridge = Bridge(self.env, self.seat, self.max_turns, partner, float(timeout))
        self._runs: dict[str, EpisodeRun] = {}
        self._unstarted: list[EpisodeRun] = []  # reset, started together when an episode is first read
        self._vocab: list[str] | None = None

    # -- loading --------------------------------------------------------------------------

    @staticmethod
    def _range(reward_range) -> tuple[float, float]:
        try:
            low, high = (float(v) for v in reward_range)
        except (TypeError, ValueError):
            raise ValueError(f"env.options.reward_range: [low, high], got {reward_range!r}") from None
        if not (math.isfinite(low) and math.isfinite(high) and high > low):
            raise ValueError(f"env.options.reward_range: need finite low < high, got {reward_range!r}")
        return low, high

    def _load_env(self, taskset: str, taskset_options: dict, env_id: str, env_options: dict):
        from verifiers.v1.utils.loaders import load_environment, resolve_env_config

        for key in ("id", "taskset"):
            if key in env_options:
                raise ValueError(
                    f"env.options.env_options.{key}: set it with env.options.{'env_id' if key == 'id' else key}"
                )
        if "id" in taskset_options:
            raise ValueError("env.options.taskset_options.id: the taskset id is env.options.taskset")
        raw = {**env_options, "taskset": {**taskset_options, "id": taskset}}
        if env_id:
            raw["id"] = env_id
        self.env_label = f"{env_id}+{taskset}" if env_id else taskset
        try:
            config = resolve_env_config(raw)
        except ModuleNotFoundError as error:
            raise ValueError(f"env.options.taskset / env_id: {error}") from None
        except Exception as error:  # pydantic's ValidationError names the field
            raise ValueError(
                f"env.options.taskset_options / env_options: the verifiers config of {self.env_label!r} is "
                f"invalid: {error}"
            ) from None
        try:
            return load_environment(config)
        except ImportError as error:
            raise ValueError(f"env.options.taskset {taskset!r}: importing it failed: {error}") from None

    def _seats(self) -> list[tuple[str, object]]:
        from verifiers.v1.configs.agent import agent_config_fields

        return list(agent_config_fields(self.env.config).items())

    def _seat(self, agent: str) -> str:
        names = [name for name, _ in self._seats()]
        if agent:
            if agent not in names:
                raise ValueError(
                    f"env.options.agent: {agent!r} is not a seat of {self.env_label!r}; its seats: {names}"
                )
            return agent
        if len(names) == 1:
            return names[0]
        for name in _SEAT_NAMES:
            if name in names:
                return name
        raise ValueError(
            f"env.options.agent: name the seat rwcore's policy plays in {self.env_label!r}: one of {names}"
        )

    def _check_task_class(self) -> None:
        vf = self._vf
        task_cls = type(self.env.taskset).task_type()
        reasons = []
        if getattr(task_cls, "NEEDS_CONTAINER", False):
            reasons.append("its tasks need a container (Task.NEEDS_CONTAINER)")
        if task_cls.toolsets(self.env.taskset.config.task) or type(self.env.taskset).toolsets(self.env.taskset.config):
            reasons.append("its tasks give the agent tools (toolsets)")
        for hook in ("setup", "finalize", "stage_verifier"):
            if getattr(task_cls, hook) is not getattr(vf.Task, hook):
                reasons.append(f"its Task.{hook} prepares a runtime")
        if reasons:
            raise ValueError(
                f"env.options.taskset {self.taskset_id!r}: {'; '.join(reasons)}. rwcore's policy plays text turns "
                "in this process (no sandbox, no tool calls); train such tasksets with verifiers' own harnesses"
            )

    def _load_splits(self, train, eval_, num_train: int, num_eval: int) -> dict[str, list[Task]]:
        from verifiers.v1.configs.select import SelectConfig

        selects = {}
        for split, given, default in (
            ("eval", eval_, {"limit": num_eval}),
            ("train", train, {"skip": num_eval, "limit": num_train}),
        ):
            options = dict(default if given is None else given)
            unknown = [k for k in options if k not in _SELECT_KEYS]
            if unknown:
                raise ValueError(f"env.options.{split}.{unknown[0]}: not a select option; known: {list(_SELECT_KEYS)}")
            try:
                selects[split] = SelectConfig(**options)
            except Exception as error:
                raise ValueError(f"env.options.{split}: {error}") from None
        taskset = self.env.taskset
        self._vf_tasks: dict[str, object] = {}
        splits: dict[str, list[Task]] = {}
        keys: dict[str, set[str]] = {}
        for split, select in selects.items():
            view = taskset.select(select)
            if not view.bounded:
                raise ValueError(
                    f"env.options.{split}: the taskset {self.taskset_id!r} is infinite; bound the split with limit "
                    "or closed include idx ranges"
                )
            with own_random():
                loaded = list(view)
            if not loaded:
                raise ValueError(f"env.options.{split}: selects no task of {self.taskset_id!r}")
            out = []
            keys[split] = set()
            for task in loaded:
                out.append(self._task(task, split))
                keys[split].add(task.key)
            splits[split] = out
        shared = keys["train"] & keys["eval"]
        if shared:
            raise ValueError(
                f"env.options.train / env.options.eval: the splits share {len(shared)} task(s) of {self.taskset_id!r} "
                f"(task.key {sorted(shared)[0][:16]}...); choose disjoint selections"
            )
        return splits

    def _task(self, vf_task, split: str) -> Task:
        data = vf_task.data.model_dump(mode="json", exclude_none=True)
        idx = vf_task.data.idx
        if vf_task.data.prompt is None and self._starts_on_prompt():
            raise ValueError(
                f"env.options.taskset {self.taskset_id!r}: task {idx} has no prompt (TaskData.prompt), and "
                f"{type(self.env).__name__} starts the agent on it"
            )
        if self.tag_field:
            try:
                value = _field(data, self.tag_field)
            except KeyError:
                raise ValueError(
                    f"env.options.tag_field: task {idx} of {self.taskset_id!r} has no field {self.tag_field!r} "
                    f"(its fields: {sorted(data)})"
                ) from None
            tags = (str(value),)
        else:
            tags = (self.taskset_id,)
        task_id = f"{self.taskset_id}/{idx}"
        self._vf_tasks[task_id] = vf_task
        return Task(task_id, tags, {"idx": idx, "key": vf_task.key, "split": split, **data})

    def _starts_on_prompt(self) -> bool:
        """Whether the environment starts the agent on the task's own prompt (verifiers' SingleAgentEnv)."""
        return type(self.env).__name__ == "SingleAgentEnv"

    # -- the simulator ----------------------------------------------------------------------

    def tasks(self, split: str) -> list[Task]:
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        return list(self._splits[split])

    def reset(self, task: Task, seed: int) -> Episode:
        """The episode; its environment starts (in its own thread, with every other episode reset since)
        when its observation, done or state is first read, which waits for it to ask for the agent's first
        message (see `_Starting`)."""
        started = self._start(task, seed)
        return _Starting(task, lambda: self.step_many([started], None)[0])

    def step(self, episode: Episode, action: str) -> Episode:
        return self.step_many([episode], [action])[0]

    def step_many(self, episodes: Sequence[Episode], actions: Sequence[str] | None) -> list[Episode]:
        """Every live episode's turn at once (their environments run concurrently, each on its own loop)."""
        self._start_pending()
        runs = [self._runs.get(e.state.get("run", "")) if not e.done else None for e in episodes]
        live = [(i, run) for i, run in enumerate(runs) if run is not None]
        if actions is not None and len(actions) != len(episodes):
            raise ValueError(f"step_many needs one action per episode, got {len(actions)} for {len(episodes)}")
        missing = [i for i, e in enumerate(episodes) if not e.done and runs[i] is None]
        if missing:
            raise ValueError(
                f"env.name 'verifiers': episode {episodes[missing[0]].task.task_id} is not running in this process "
                "(verifiers episodes live in the process that reset them)"
            )
        replies = None if actions is None else [actions[i] for i, _ in live]
        run_all(self._bridge, [run for _, run in live], replies, own_random)
        out = list(episodes)
        for i, run in live:
            out[i] = self._episode(episodes[i], run, turned=actions is not None)
        return out

    def _start(self, task: Task, seed: int) -> Episode:
        vf_task = self._vf_tasks.get(task.task_id)
        if vf_task is None:
            raise ValueError(f"env.name 'verifiers': unknown task {task.task_id!r}")
        own = task.data.get("system_prompt") or ""
        prefix = own if (own and not self._shared_prompt) else ""
        run = EpisodeRun(vf_task, int(seed), prefix)
        self._runs[run.id] = run
        self._unstarted.append(run)
        return Episode(task, "", False, {"run": run.id, "turns": 0})

    def _start_pending(self) -> None:
        if self._unstarted:
            runs, self._unstarted = self._unstarted, []
            self._bridge.start_many(runs)

    def _episode(self, episode: Episode, run: EpisodeRun, turned: bool = False) -> Episode:
        if run.fatal and not run.abandoned:
            self._runs.pop(run.id, None)
            raise SetupError(f"env.name 'verifiers' ({self.env_label}): {run.fatal}")
        state = dict(episode.state)
        state["turns"] = int(state.get("turns", 0)) + int(turned)
        if run.future.done():
            self._runs.pop(run.id, None)
            state["result"] = self._result(run)
            state.pop("run", None)
            if state["result"]["failure"]:
                return partner_failed(Episode(episode.task, "", False, state), state["result"]["failure"])
            return Episode(episode.task, "", True, state)
        observation, _ = run.pending
        return Episode(episode.task, observation, False, state)

    def _result(self, run: EpisodeRun) -> dict:
        """The finished episode as JSON: rewards, metrics, the weighted reward, or why it failed (every string
        from the environment cut: names to MAX_NAME characters, the reason to 500)."""
        label = f"verifiers env {self.env_label!r}"
        failed = {"rewards": {}, "metrics": {}}
        if run.future.cancelled():
            return {"failure": f"{label} was cancelled", **failed}
        error = run.future.exception()
        if isinstance(error, EnvironmentFault):  # a timeout, a BaseException, the environment closed
            return {"failure": cut(f"{label} {error}", _MAX_REASON), **failed}
        if error is not None:
            reason = f"{label} raised {type(error).__name__}: {cut(str(error), _MAX_REASON)}"
            return {"failure": cut(reason, _MAX_REASON), **failed}
        vf_episode = run.future.result()
        traces = [t for t in vf_episode.traces if t.agent.name == self.seat]
        failure = ""
        if vf_episode.errors:
            first = vf_episode.errors[0]
            failure = f"{label}: {cut(str(first.type), MAX_NAME)}: {cut(str(first.message), _MAX_REASON)}"
        elif not traces:
            failure = f"{label} ran no turn of its seat {self.seat!r}"
        trace = traces[-1] if traces else None
        if not failure and trace.errors:
            first = trace.errors[0]
            failure = (
                f"{label}: scoring failed: {cut(str(first.type), MAX_NAME)}: {cut(str(first.message), _MAX_REASON)}"
            )
        rewards, metrics, total = {}, {}, 0.0
        if trace is not None and not failure:
            for name, reward in trace.rewards.items():
                name = cut(str(name), MAX_NAME)
                if reward is None:
                    failure = failure or f"{label}: reward {name!r} was not scored"
                    continue
                if not (math.isfinite(reward.score) and math.isfinite(reward.weight)):
                    failure = failure or f"{label}: reward {name!r} is {reward.score} (weight {reward.weight})"
                    continue
                total += float(reward.score) * float(reward.weight)
                if len(rewards) < _MAX_SCORES:
                    rewards[name] = [float(reward.score), float(reward.weight)]
            for name, value in trace.metrics.items():
                if len(metrics) >= _MAX_SCORES:
                    break
                if value is not None and math.isfinite(value):
                    metrics[cut(str(name), MAX_NAME)] = float(value)
        return {
            "failure": cut(failure, _MAX_REASON),
            "rewards": rewards,
            "metrics": metrics,
            "reward": total,
            "stop_condition": cut(str(trace.stop_condition), MAX_NAME)
            if trace is not None and trace.stop_condition is not None
            else None,
            "turns": trace.num_turns if trace is not None else 0,
        }

    def outcome(self, episode: Episode) -> Outcome:
        result = episode.state.get("result")
        if result is None:  # rw train's turn limit ended it: the parked turn comes back terminated
            self._start_pending()
            run = self._runs.get(episode.state.get("run", ""))
            if run is None:
                return Outcome(0.0, False, "episode not running", failure="verifiers episode not running")
            run_all(self._bridge, [run], [_TERMINATE], own_random)
            if not run.future.done():
                self._bridge.wait([run])
            episode = self._episode(episode, run)
            result = episode.state.get("result") or {"failure": "verifiers episode did not end", "rewards": {}}
        if result["failure"]:
            return Outcome(0.0, False, result["failure"], failure=result["failure"])
        raw = result["reward"]
        reward = min(1.0, max(0.0, (raw - self.reward_low) / (self.reward_high - self.reward_low)))
        success = raw >= self.success_threshold
        details = {
            "verifiers_reward": raw,
            "rewards": {name: score for name, (score, _) in result["rewards"].items()},
            "metrics": {
                **{f"reward/{name}": score for name, (score, _) in result["rewards"].items()},
                **result["metrics"],
            },
            "stop_condition": result["stop_condition"],
        }
        reason = f"reward {raw:g} ({', '.join(f'{n}={s:g}x{w:g}' for n, (s, w) in result['rewards'].items())})"
        return Outcome(reward, success, reason, details=details)

    def outcome_many(self, episodes: Sequence[Episode]) -> list[Outcome]:
        """Every episode's outcome; those rw train's turn limit ended are handed back terminated together,
        so their environments finish (and score) concurrently, each within env.options.timeout."""
        runs = []
        for episode in episodes:
            if episode.state.get("result") is None:
                run = self._runs.get(episode.state.get("run", ""))
                if run is not None and not run.future.done():
                    runs.append(run)
        if runs:
            run_all(self._bridge, runs, [_TERMINATE] * len(runs), own_random)
        return [self.outcome(episode) for episode in episodes]

    def vocabulary(self) -> list[str]:
        if self._vocab is None:
            words = set(self.system_prompt.lower().split()) | {w.lower() for w in self._extra_words}
            words |= {w.lower() for w in self._actions}
            for split in self._splits.values():
                for task in split:
                    vf_task = self._vf_tasks[task.task_id]
                    words |= set(message_text(vf_task.data.prompt).lower().split())
                    words |= set((vf_task.data.system_prompt or "").lower().split())
            self._vocab = sorted(w for w in words if w)
        return list(self._vocab)

    # -- providers: the environment's own rewards as programmatic rubrics -----------------------

    def rules(self) -> list[Rule]:
        """One rubric per reward function: "the episode earned full marks on <name>" (its score >= the
        score that gives success alone), read from the scores verifiers recorded - for judge.kind=rule runs
        (RuleReflector / RuleAttributor over them); with judge.kind=openai the LLM judge writes its own."""
        return rubrics.reward_rules(self._reward_names())

    def reflector(self):
        return rubrics.reflector(self.rules())

    def attributor(self):
        return rubrics.attributor(self.rules())

    def _reward_names(self) -> list[str]:
        """The reward names the tasks declare (@reward methods, plugged rewards and judges); rewards an Env
        records itself in run() (e.g. TextArena's game_reward) are known only from episodes."""
        probe = next(iter(self._vf_tasks.values()))
        names = [fn.__name__ for fn in probe.hooks("reward")]
        names += [judge.reward_name for judge in probe.plugged_judges()]
        return sorted(dict.fromkeys(names))

    def close(self) -> None:
        self._unstarted.clear()
        self._bridge.close()
