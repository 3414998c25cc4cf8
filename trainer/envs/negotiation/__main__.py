"""`python -m rwcore.trainer.envs.negotiation`: the held-out success of the scripted and the random policy and
of the best fixed message sequence."""

from rwcore.trainer.envs.negotiation.environment import NegotiationEnv
from rwcore.trainer.envs.negotiation.reference_policies import evaluate_policy, random_policy, scripted_policy
from rwcore.trainer.envs.negotiation.search import best_fixed_sequence


def _main() -> None:  # python -m rwcore.trainer.envs.negotiation
    env = NegotiationEnv()
    scripted, _ = evaluate_policy(env, lambda observation, rng: scripted_policy(observation))
    rand, _ = evaluate_policy(env, random_policy, seeds=range(20))
    rate, sequence = best_fixed_sequence(env)
    print(
        f"held-out success over {len(env.tasks('eval'))} tasks: scripted {scripted:.3f}, random {rand:.4f} "
        f"(20 seeds), best fixed sequence {rate:.3f} ({', '.join(sequence)})"
    )


if __name__ == "__main__":
    _main()
