"""Asynchronous rollouts (`rollout.max_lag = K > 0`): generation runs ahead of the update.

A separate rollout process holds its own copy of the policy (HF generate, or a
vLLM engine for rollout.engine=vllm) and runs whole episodes. The trainer keeps
it fed on a fixed schedule: as soon as it takes the rollouts of step t it
submits those of every step up to t + K (their tasks sampled from the evidence
so far), then judges, scores and updates while they are generated, and after
the update it pushes the new weights. The
process answers requests in order, so the rollouts of step s always come from
policy version max(0, s - K) — whatever the timing — and a run is reproducible
from its seed (each request carries its seed; the process reseeds torch's
generator from it before generating).

While the trainer judges and updates on step t, the process generates step
t + 1: on a CPU each takes its share of the cores (`threads` each), which is where the
speed-up comes from; on a GPU the two share the device.

Checkpoints hold the rollouts already requested but not yet trained on
(`state_dict` waits for them), so a resumed run trains on exactly what the
uninterrupted run would have. A process that dies ends the run with an error
naming the checkpoint to resume from; it never hangs the trainer.
"""

from __future__ import annotations

import os
import queue
import signal
import sys
import traceback
from dataclasses import dataclass

import torch

_POLL_SECONDS = 1.0


@dataclass
class _Request:
    step: int
    task_ids: list
    jobs: list  # (Task, seed, group_id)
    prompt: str
    seed: int


class RolloutProcess:
    """The rollout worker: `submit` requests, `push` weights, `take` results, all in order.

    config: the run's Config (the process builds the environment and the policy from it);
    threads: torch threads of the process.
    """

    def __init__(self, config, threads: int, weights: dict, version: int) -> None:
        ctx = torch.multiprocessing.get_context("spawn")
        self._requests = ctx.Queue()
        self._results = ctx.Queue()
        self._process = ctx.Process(
            target=_serve,
            args=(config, int(threads), self._requests, self._results, os.getpid()),
            name="rw-rollout",
            daemon=True,
        )
        self._process.start()
        self._submitted: dict[int, list] = {}  # step -> task ids, in submission order
        self._done: dict[int, list] = {}  # step -> rollouts received
        self.push(weights, version)
        self._wait("ready")

    # ------------------------------------------------------------------ requests

    def push(self, weights: dict, version: int) -> None:
        """The policy's weights as version `version`; rollouts submitted after this use them."""
        self._put(
            ("weights", int(version), {name: tensor.detach().to("cpu", copy=True) for name, tensor in weights.items()})
        )

    def submit(self, step: int, task_ids: list, jobs: list, prompt: str, seed: int) -> None:
        self._submitted[int(step)] = list(task_ids)
        self._put(("rollout", _Request(int(step), list(task_ids), list(jobs), prompt, int(seed))))

    def pending(self) -> list[int]:
        """Steps submitted (or restored) and not yet taken, in order."""
        return sorted(set(self._submitted) | set(self._done))

    def take(self, step: int) -> tuple[list, list]:
        """(task ids, rollouts) of `step`, waiting for the process if it is still generating them."""
        step = int(step)
        while step not in self._done:
            if step not in self._submitted:
                raise RuntimeError(f"rollouts of step {step} were never requested")
            self._receive()
        rollouts = self._done.pop(step)
        return self._submitted.pop(step), rollouts

    def state_dict(self) -> dict:
        """Every pending step's task ids and rollouts (waits for the ones still being generated)."""
        for step in list(self._submitted):
            while step not in self._done:
                self._receive()
        return {step: {"task_ids": self._submitted[step], "rollouts": self._done[step]} for step in self.pending()}

    def load_state_dict(self, state: dict) -> None:
        """Restores pending rollouts saved by `state_dict` (they are not generated again)."""
        for step, entry in state.items():
            self._submitted[int(step)] = list(entry["task_ids"])
            self._done[int(step)] = list(entry["rollouts"])

    def close(self) -> None:
        if self._process.is_alive():
            try:
                self._requests.put(("stop",))
            except (OSError, ValueError):
                pass
            self._process.join(timeout=10)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join(timeout=5)

    # ------------------------------------------------------------------ plumbing

    def _put(self, message) -> None:
        self._check_alive()
        self._requests.put(message)

    def _check_alive(self) -> None:
        if not self._process.is_alive():
            raise RolloutProcessDied(
                f"the rollout process (rollout.max_lag) died with exit code {self._process.exitcode}"
            )

    def _wait(self, kind: str):
        while True:
            message = self._get()
            if message[0] == kind:
                return message

    def _receive(self) -> None:
        message = self._get()
        if message[0] == "rollouts":
            _, step, rollouts = message
            self._done[step] = [_from_wire(r) for r in rollouts]

    def _get(self):
        while True:
            try:
                message = self._results.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                self._check_alive()
                continue
            if message[0] == "error":
                self.close()
                raise RolloutProcessDied(f"the rollout process (rollout.max_lag) failed:\n{message[1]}")
            return message


class RolloutProcessDied(RuntimeError):
    """The rollout process exited or raised; the run ends and can resume from its latest checkpoint."""


def _to_wire(rollout):
    """A rollout as plain Python data for the queue (no shared-memory tensors to keep alive)."""
    rollout.behavior_logprobs = rollout.behavior_logprobs.tolist()
    return rollout


def _from_wire(rollout):
    rollout.behavior_logprobs = torch.tensor(rollout.behavior_logprobs, dtype=torch.float32)
    return rollout


def _die_with_parent(parent: int) -> None:
    """Linux: the kernel kills this process when the trainer dies, however it dies. `daemon=True` only covers a
    trainer that exits normally; after a `kill -9` the worker would otherwise live on, idle, as an orphan."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    if ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0) != 0:  # PR_SET_PDEATHSIG
        return  # not fatal: only the orphan after a kill -9 is at stake
    if os.getppid() != parent:  # the trainer died before the signal was armed
        os._exit(1)


def _serve(config, threads: int, requests, results, parent: int) -> None:
    """The rollout process: builds the environment and policy, then answers requests in order."""
    _die_with_parent(parent)
    try:
        torch.set_num_threads(threads)
        from rwcore.trainer import envs
        from rwcore.trainer.policy import build_policy
        from rwcore.trainer.rollout import run_episodes

        env = envs.make(config.env.name, **dict(config.env.options))
        policy = build_policy(
            config,
            env,
            torch.device("cpu") if not torch.cuda.is_available() else torch.device("cuda", torch.cuda.current_device()),
        )
        policy.model.eval()
        generator = None
        if config.rollout.engine == "vllm":
            from rwcore.trainer.vllm_rollout import VLLMGenerator

            generator = VLLMGenerator.for_config(policy, config, in_process=True)
        if config.judge.kind == "openai" and callable(getattr(env, "configure_llm_defaults", None)):
            env.configure_llm_defaults(config.judge.model, config.judge.base_url or None, config.judge.api_key_env)
        if callable(getattr(env, "attach_policy", None)):  # self-play: this process's (lagged) policy plays the partner
            from rwcore.trainer.rollout import policy_text_generator

            env.attach_policy(
                policy_text_generator(
                    policy, generator, config.rollout.temperature, config.rollout.max_new_tokens, config.train.seed
                )
            )
        ready = False
        while True:
            message = requests.get()
            if message[0] == "stop":
                break
            if message[0] == "weights":
                _, version, weights = message
                if generator is not None:
                    generator.push(weights)
                else:
                    policy.model.load_state_dict(weights)
                policy.version = version
                if not ready:
                    results.put(("ready",))
                    ready = True
                continue
            request: _Request = message[1]
            torch.manual_seed(request.seed)
            rollouts = run_episodes(
                env,
                policy,
                request.jobs,
                request.prompt,
                config.rollout.temperature,
                config.rollout.max_new_tokens,
                generator=generator,
            )
            if any(not r.behavior_logprobs.numel() for r in rollouts):
                # the trainer cannot rescore lagged rollouts: it no longer holds the version that sampled them
                raise RuntimeError(
                    "the rollout engine returned no log-probs for some sampled tokens (a stop "
                    "token without its log-prob); asynchronous training needs them"
                )
            results.put(("rollouts", request.step, [_to_wire(r) for r in rollouts]))
        if generator is not None:
            generator.close()
    except BaseException:  # reported to the trainer, which ends the run with it
        results.put(("error", traceback.format_exc()))
