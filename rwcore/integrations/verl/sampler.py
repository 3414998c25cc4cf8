"""Arise's capability sampler as a stateful sampler for verl's data loader."""

from __future__ import annotations

import functools
import importlib.util
import warnings
from collections.abc import Hashable, Mapping

import numpy as np
import torch

from rwcore.verdict import Verdict

from .config import OUTCOME_KEY, TAGS_KEY, TASK_ID_KEY, UID_KEY, VERDICTS_KEY, _get, _plain
from .verdicts import verdicts_from_batch


def _column_names(frame):
    if frame is None:
        return None
    names = getattr(frame, "column_names", None)
    if names is None and hasattr(frame, "columns"):
        names = list(frame.columns)
    return None if names is None else list(names)


def _tag_list(value) -> list:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        return [value]
    return list(value)


def _dataset_tasks(data_source, task_id_key: str, tags_key: str) -> tuple[list, list]:
    """(task id, tags) of every dataset row, from columns (a verl RLHFDataset's `dataframe`) or rows.

    Task id: column `task_id_key`, else key `task_id_key` of the row's `extra_info` dict.
    Tags: column `tags_key`, else that key of `extra_info`, else the row's `data_source`, else "default".
    """
    n = len(data_source)
    frame = getattr(data_source, "dataframe", None)
    names = _column_names(frame)
    if names is not None:

        def field(name):
            return list(frame[name]) if name in names else [None] * n
    else:
        rows = [data_source[i] for i in range(n)]

        def field(name):
            return [row.get(name) if isinstance(row, Mapping) else None for row in rows]

    ids, tags, extras, sources = field(task_id_key), field(tags_key), field("extra_info"), field("data_source")
    if len(ids) != n:
        raise ValueError(f"the dataset's dataframe has {len(ids)} rows but len(dataset) is {n}")
    task_ids, task_tags = [], []
    for i in range(n):
        extra = extras[i] if isinstance(extras[i], Mapping) else {}
        task_id = ids[i] if ids[i] is not None else extra.get(task_id_key)
        if task_id is None:
            raise ValueError(
                f"dataset row {i} has no task id: add a column {task_id_key!r} (or that key in "
                "extra_info), or set data.sampler.task_id_key"
            )
        tag = tags[i] if tags[i] is not None else extra.get(tags_key)
        if tag is None:
            tag = sources[i] if sources[i] is not None else "default"
        task_ids.append(task_id.item() if isinstance(task_id, np.generic) else task_id)
        task_tags.append(_tag_list(tag))
    return task_ids, task_tags


def _row_values(non_tensor: Mapping, key: str, n: int, required: bool = True):
    """non_tensor_batch[key], or key of each row's extra_info; None when absent and not required."""
    if key in non_tensor:
        values = list(non_tensor[key])
    elif "extra_info" in non_tensor and all(isinstance(e, Mapping) and key in e for e in non_tensor["extra_info"]):
        values = [e[key] for e in non_tensor["extra_info"]]
    elif required:
        raise ValueError(f"batch.non_tensor_batch has no {key!r} (nor extra_info[{key!r}]); keys: {sorted(non_tensor)}")
    else:
        return None
    if len(values) != n:
        raise ValueError(f"non_tensor_batch[{key!r}] has {len(values)} entries, expected {n}")
    return values


class _CurriculumSamplerImpl:
    """The logic of `RwcoreCurriculumSampler` (see its docstring); the base class is chosen lazily."""

    def __init__(self, data_source, data_config=None, *, sampler=None) -> None:
        from rwcore.arise.sampler import CapabilitySampler
        from rwcore.sampling.batch import AdaptiveBatchSampler  # torch.utils.data; imported with the sampler only

        settings = _plain(_get(data_config, "sampler", None)) or {}
        if not isinstance(settings, Mapping):
            raise ValueError(f"data.sampler must be a mapping, got {type(settings).__name__}")
        self.uid_key = settings.get("uid_key") or UID_KEY
        self.task_id_key = settings.get("task_id_key") or TASK_ID_KEY
        self.tags_key = settings.get("tags_key") or TAGS_KEY
        self.verdicts_key = settings.get("verdicts_key") or VERDICTS_KEY
        self.outcome_key = settings.get("outcome_key") or OUTCOME_KEY
        order = settings.get("rubric_order")
        self.rubric_order = None if order is None else list(order)
        task_ids, task_tags = _dataset_tasks(data_source, self.task_id_key, self.tags_key)
        loader_batch = _get(data_config, "gen_batch_size", None) or _get(data_config, "train_batch_size", None)
        if sampler is None:
            group_size = settings.get("group_size")
            if group_size is None:
                raise ValueError(
                    "data.sampler.group_size is required (responses per prompt): "
                    "+data.sampler.group_size=${actor_rollout_ref.rollout.n}"
                )
            batch_size = settings.get("batch_size") or loader_batch
            if batch_size is None:
                raise ValueError("data.sampler.batch_size (or data.train_batch_size) is required")
            options = {
                k: settings[k]
                for k in ("rho_min", "quota_fraction", "gamma_obs", "gamma_unobs", "capabilities")
                if settings.get(k) is not None
            }
            seed = settings.get("seed", _get(data_config, "seed", 0))
            sampler = CapabilitySampler(
                dict(zip(task_ids, task_tags)),
                batch_size=int(batch_size),
                group_size=int(group_size),
                seed=int(seed or 0),
                **options,
            )
            rubrics = settings.get("rubrics")
            if rubrics is None and settings.get("rubrics_file"):
                rubrics = _load_rubrics(settings["rubrics_file"])
            if rubrics:
                sampler.set_rubrics(dict(rubrics))
        if loader_batch is not None and int(loader_batch) != sampler.batch_size:
            raise ValueError(
                f"the sampler draws batches of {sampler.batch_size} tasks but verl's loader takes "
                f"{loader_batch} (data.gen_batch_size / train_batch_size): they must agree"
            )
        num_batches = settings.get("num_batches") or max(1, len(task_ids) // sampler.batch_size)
        self._batches = AdaptiveBatchSampler(sampler, task_ids, int(num_batches))
        self.last_update: dict = {}
        self._warned_incomplete = False

    # -- the wrapped pieces ---------------------------------------------------------------

    @property
    def sampler(self):
        """The rwcore task sampler (CapabilitySampler unless one was passed)."""
        return self._batches.sampler

    @property
    def batch_size(self) -> int:
        return self.sampler.batch_size

    @property
    def num_batches(self) -> int:
        return self._batches.num_batches

    @property
    def policy_version(self) -> int:
        return self._batches.policy_version

    def set_rubrics(self, rubrics: Mapping[Hashable, str]) -> None:
        """Replaces the active rubric pool (rubric id -> capability), e.g. from RubricSkillPool."""
        self.sampler.set_rubrics(rubrics)

    # -- torch Sampler ---------------------------------------------------------------------

    def __iter__(self):
        # One rwcore batch of distinct tasks per loader batch, drawn when the loader asks for its
        # first index (verl requires num_workers=0 with a curriculum sampler), so it sees every
        # update() so far.
        for batch in self._batches:
            yield from batch

    def __len__(self) -> int:
        return self.num_batches * self.batch_size

    # -- feedback ---------------------------------------------------------------------------

    def groups_from_batch(self, batch) -> list[tuple]:
        """[(task id, {rubric id: [group_size verdicts]}, outcomes or None)] per complete uid group of `batch`."""
        non_tensor = batch.non_tensor_batch
        uids = non_tensor.get(self.uid_key)
        if uids is None:
            raise ValueError(f"batch.non_tensor_batch has no {self.uid_key!r} (verl's per-prompt group id)")
        n = len(uids)
        task_ids = _row_values(non_tensor, self.task_id_key, n)
        found = verdicts_from_batch(non_tensor, n, self.verdicts_key, self.rubric_order)
        rubric_ids, codes = found if found is not None else ([], np.zeros((n, 0), dtype=np.uint8))
        outcomes = _row_values(non_tensor, self.outcome_key, n, required=False)
        members: dict = {}
        for row, uid in enumerate(uids):
            members.setdefault(uid, []).append(row)
        groups, incomplete = [], 0
        for uid, rows in members.items():
            if len(rows) != self.sampler.group_size:
                incomplete += 1
                continue
            task_set = {task_ids[r] for r in rows}
            if len(task_set) != 1:
                raise ValueError(f"group {uid!r} mixes task ids {sorted(map(repr, task_set))}")
            task_id = task_ids[rows[0]]
            task_id = task_id.item() if isinstance(task_id, np.generic) else task_id
            sub = codes[rows]
            verdicts = {
                rubric_ids[i]: [Verdict(int(code)) for code in sub[:, i]]
                for i in range(len(rubric_ids))
                if np.any(sub[:, i] != Verdict.INVALID)
            }
            group_outcomes = None if outcomes is None else [float(outcomes[r]) for r in rows]
            groups.append((task_id, verdicts, group_outcomes))
        if incomplete and not self._warned_incomplete:
            warnings.warn(
                f"RwcoreCurriculumSampler.update: skipped {incomplete} uid group(s) without exactly "
                f"group_size={self.sampler.group_size} responses",
                stacklevel=3,
            )
            self._warned_incomplete = True
        self.last_update = {"groups": len(groups), "skipped_groups": incomplete}
        return groups

    def update(self, batch) -> None:
        """verl's curriculum hook, called once per step after the update with the step's `DataProto`.

        Records every complete uid group (task id from non_tensor_batch[task_id_key], verdicts from
        non_tensor_batch[verdicts_key], outcomes from non_tensor_batch[outcome_key] when present) at
        the current policy version, then advances the version. All groups are checked before any is
        recorded, so a bad batch changes nothing.
        """
        from rwcore.tasks import parse_group, parse_outcomes

        groups = self.groups_from_batch(batch)
        known = set(self.sampler.task_ids)
        pool = self.sampler.rubrics
        for task_id, verdicts, outcomes in groups:
            if task_id not in known:
                raise ValueError(f"task id {task_id!r} is not one of the sampler's tasks")
            parse_group(verdicts, pool, self.sampler.group_size)
            parse_outcomes(outcomes, self.sampler.group_size, required=False)
        for task_id, verdicts, outcomes in groups:
            self._batches.feedback(task_id, verdicts, outcomes=outcomes)
        self._batches.advance_policy()

    # -- checkpointing -----------------------------------------------------------------------

    def state_dict(self) -> dict:
        """Sampler evidence and generator, policy version and position in the pass (picklable)."""
        return {"kind": "RwcoreCurriculumSampler", "format": 1, "batches": self._batches.state_dict()}

    def load_state_dict(self, state: Mapping) -> None:
        """Restores `state_dict()`; the next `iter(self)` continues exactly where the saved one stood."""
        if not isinstance(state, Mapping) or state.get("kind") != "RwcoreCurriculumSampler":
            raise ValueError("state_dict is not a RwcoreCurriculumSampler state")
        if state.get("format") != 1:
            raise ValueError(f"state_dict has format {state.get('format')!r}; this version reads 1")
        self._batches.load_state_dict(state["batches"])


def _load_rubrics(path) -> dict:
    """rubric id -> capability from a JSON or YAML file."""
    import json

    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    if str(path).endswith((".yaml", ".yml")):
        import yaml

        data = yaml.safe_load(text)
    else:
        data = json.loads(text)
    if not isinstance(data, Mapping):
        raise ValueError(f"{path}: expected a mapping rubric id -> capability")
    return dict(data)


_SAMPLER_DOC = """Arise's capability sampler as a verl curriculum sampler (an `AbstractCurriculumSampler` when verl
has it).

    # verl 0.9 (V1 trainer): trainer mode rwcore_sync builds it from data.rwcore_sampler (docs/integrations.md)
    trainer.v1.trainer_mode=rwcore_sync
    +data.rwcore_sampler.rubrics={cites-order-id: Verification, no-duplicate-calls: Efficiency}
    data.dataloader_num_workers=0
    # verl 0.8 (and 0.9's legacy trainer): python -m rwcore.integrations.verl.legacy, same data.rwcore_sampler

    It is built as `cls(data_source=dataset, data_config)` (verl <= 0.7 did that itself through
    data.sampler.class_path / class_name); the rwcore settings live in `data_config["sampler"]`: group_size
    (required), batch_size (default data.gen_batch_size or data.train_batch_size, which it must equal), rubrics
    (rubric id -> capability) or rubrics_file,
    num_batches per pass (default len(dataset) // batch_size), seed (default data.seed, else 0),
    rho_min, quota_fraction, gamma_obs, gamma_unobs, capabilities, and the key names task_id_key
    ("rwcore_task_id"), tags_key ("rwcore_tags"), verdicts_key ("rwcore_verdicts"), outcome_key
    ("rwcore_outcome"), uid_key ("uid"), rubric_order. `sampler=` passes a ready rwcore sampler
    (CapabilitySampler, OutcomeSampler, UniformSampler) instead, e.g. to RayPPOTrainer(train_sampler=...).

    Dataset rows: each row is one task, its id in column `task_id_key` (or that key of `extra_info`),
    its tags in `tags_key` (default: the row's `data_source`). Batches: verl's loader groups the indices
    this sampler yields into batches of batch_size; each is one `sampler.sample(policy_version)`
    (distinct tasks), drawn when the loader needs it.

    `update(batch)` (verl calls it after each step with the step's DataProto) reads, per response,
    non_tensor_batch["uid"] (group), [task_id_key] (the dataset column, carried by verl), and
    [verdicts_key] -- what the reward function returns as extra info: a mapping {rubric id:
    verdict} per response, verdicts True/False/1.0/0.0/"pass"/"fail"/"na"/"invalid"/None or NaN (n/a);
    a rubric absent from a response counts as not evaluated (Verdict.INVALID); or one key
    f"{verdicts_key}/{rubric id}" per rubric with one verdict per response (see verdicts_from_batch)
    -- then records one group per uid with exactly group_size responses (others are skipped with a
    warning) and advances the policy version.

    `state_dict` / `load_state_dict` make it a torchdata `Stateful`: `StatefulDataLoader` saves it
    with the loader (verl's data.pt) and, on resume, loads it and calls `iter(sampler)` afresh, which
    continues with the next batch, evidence, rubric pool and generator restored. Note that verl 0.7.1's
    fit loop saves the checkpoint *before* it calls `update(batch)` in the same step, so a run resumed
    from step k's checkpoint lacks step k's feedback (and its policy version is one lower) compared
    with the uninterrupted run (the sampler itself resumes exactly from the state it saved).
    """


@functools.cache
def sampler_class() -> type:
    """`RwcoreCurriculumSampler`, built once: an `AbstractCurriculumSampler` on verl <= 0.7, else a torch Sampler."""
    return _build_sampler_class()


def _build_sampler_class():
    base = torch.utils.data.Sampler
    if importlib.util.find_spec("verl") is not None:
        try:
            from verl.experimental.dataset.sampler import AbstractCurriculumSampler as base  # verl <= 0.7
        except ImportError:
            pass  # verl >= 0.8 has no curriculum hook: a plain stateful Sampler
    return type(
        "RwcoreCurriculumSampler",
        (_CurriculumSamplerImpl, base),
        {
            "__module__": __name__.rpartition(".")[0],
            "__qualname__": "RwcoreCurriculumSampler",
            "__doc__": _SAMPLER_DOC,
        },
    )
