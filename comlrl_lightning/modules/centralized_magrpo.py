"""CentralizedMAGRPOModule: MAGRPO of one joint policy that writes every role's output in one text (CoMLRL
1.4.3's ``CentralizedMAGRPOTrainer``; docs/coming-from-comlrl.md), single turn.

The loss is MAGRPO's (docs/multiturn.md §2.8) over the joint completion, as CoMLRL's ``joint_policy_gradient_loss``:
per sampled joint text, the sum of its token log-probs (every role's tokens, up to and including the first EOS,
never the padding after it) times its advantage (group baseline, then ``advantage_normalization``), averaged over
the group. One difference: CoMLRL divides by the group size K, counting an empty completion as a zero term; here
the mean is over the K' non-empty completions, as for every MAGRPO agent (a completion is empty only when the
sampler returns no token at all).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable

from comlrl_lightning.collaboration import CentralizedReward
from comlrl_lightning.config.magrpo import CentralizedMAGRPOConfig
from comlrl_lightning.modules.magrpo import MAGRPOModule
from comlrl_lightning.tiny import TINY_MODEL_NAME


class CentralizedMAGRPOModule(MAGRPOModule):
    """MAGRPO of one joint policy that writes every role (CoMLRL 1.4.3's ``CentralizedMAGRPOTrainer``), with a
    :class:`~comlrl_lightning.data.centralized.CentralizedTaskDataModule`.

    ``args`` is a :class:`~comlrl_lightning.config.magrpo.CentralizedMAGRPOConfig` (``num_agents`` = roles); the team
    holds one actor model trained with ``args.learner_args()``. The loss is MAGRPO's over the joint completion:
    the sum of the joint text's token log-probs (every role's tokens, up to and including the first EOS) times
    its advantage, the mean over the group (CoMLRL's ``joint_policy_gradient_loss``). Evaluation scores joint
    texts and splits them per role: ``eval_logger`` receives ``agent_completions_turns[role][item][turn]``, and
    ``eval/role{r}/completions/mean_length`` (tokens of the learner's tokenizer) and ``eval/role{r}/empty_rate``
    (the share of samples whose role output is empty, e.g. a missing tag) are logged per role.
    Other arguments as :class:`~comlrl_lightning.modules.magrpo.MAGRPOModule`.
    """

    algorithm_name = "CentralizedMAGRPO"

    def __init__(self, agent_model: str | None = TINY_MODEL_NAME, agents: Sequence[Any] | None = None,
                 tokenizer: Any = None, model_config: dict | None = None, lora: dict | None = None,
                 args: CentralizedMAGRPOConfig | None = None, optimizer: OptimizerCallable | None = None,
                 lr_scheduler: LRSchedulerCallable | None = None):
        centralized = args if args is not None else CentralizedMAGRPOConfig()
        if not isinstance(centralized, CentralizedMAGRPOConfig):
            raise TypeError(f"CentralizedMAGRPOModule needs args of type CentralizedMAGRPOConfig; got "
                            f"{type(centralized).__name__}.")
        if agents is not None and len(agents) != 1:
            raise ValueError(f"Centralized collaboration requires exactly one actor model; got {len(agents)} agents.")
        if isinstance(tokenizer, (list, tuple)) and len(tokenizer) != 1:
            raise ValueError(f"Centralized collaboration requires one actor tokenizer; got {len(tokenizer)}.")
        super().__init__(agent_model=agent_model, agents=agents, tokenizer=tokenizer, model_config=model_config,
                         lora=lora, args=centralized.learner_args(), optimizer=optimizer, lr_scheduler=lr_scheduler)
        self.centralized_args = centralized
        self.num_roles = centralized.num_agents

    def setup(self, stage: str) -> None:
        super().setup(stage)
        dm = self.task
        if dm is None:
            return
        if not isinstance(getattr(dm, "joint_reward", None), CentralizedReward):
            raise ValueError(f"CentralizedMAGRPOModule needs a CentralizedTaskDataModule (the roles' prompts and "
                             f"reward behind the joint text); got {type(dm).__name__}.")
        if dm.num_roles != self.num_roles:
            raise ValueError(f"The data module was built for num_agents={dm.num_roles} roles but the module's "
                             f"args.num_agents={self.num_roles}. Set both to the number of roles.")

    def evaluate(self, items: Sequence[dict], task: Any, seed: int = 12345, samples_per_item: int = 1) -> dict:
        """The joint learner's evaluation (``eval/reward_mean`` over joint texts), split per role."""
        metrics = super().evaluate(items, task, seed, samples_per_item)
        joint = getattr(metrics, "completions", None)
        if not joint or getattr(task, "joint_reward", None) is None:
            return metrics
        tokenizer = self.team.tokenizers[0]
        per_role: list[list[list[str]]] = [[] for _ in range(self.num_roles)]
        for turns, item in zip(joint[0], metrics.batch_items):
            outputs = [task.joint_reward.split(text, item) for text in turns]
            for r in range(self.num_roles):
                per_role[r].append([o[r] for o in outputs])
        for r, paths in enumerate(per_role):
            texts = [t for turns in paths for t in turns]
            lengths = [len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
            metrics[f"eval/role{r}/completions/mean_length"] = sum(lengths) / max(1, len(lengths))
            metrics[f"eval/role{r}/empty_rate"] = sum(not t.strip() for t in texts) / max(1, len(texts))
        metrics.completions = per_role
        return metrics
