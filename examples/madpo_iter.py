"""Iterative MADPO as in CoMLRL: rounds of current-vs-comparator pairs, lambda-decay replay."""

from _task import MODEL, formatters, reward_func, train_data

from comlrl_lightning.trainers.preference import MADPOIterConfig, MADPOIterTrainer

args = MADPOIterConfig(
    num_iterations=2,
    num_train_epochs=1,
    preference_num_candidates=2,
    preference_pairs_per_sample=1,
    preference_replay_mode="lambda_decay",
    preference_replay_lambda=0.8,
    preference_replay_sample_size=4,
    comparator_policy="history",
    comparator_history_k=1,
    preference_replay_dir="outputs/madpo_iter/preference_replay",
    policy_checkpoint_dir="outputs/madpo_iter/policy_checkpoints",
    max_new_tokens=4,
    eval_interval=0,
)
trainer = MADPOIterTrainer(
    agent_model=MODEL,
    num_agents=2,
    train_dataset=train_data,
    reward_func=reward_func,
    formatters=formatters,
    args=args,
)
trainer.train()
