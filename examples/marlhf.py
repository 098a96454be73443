"""MARLHF as in CoMLRL: a joint reward model fitted on preference pairs, then MAGRPO on the learned reward."""

from _task import MODEL, eval_data, formatters, reward_func, train_data

from comlrl_lightning.trainers.preference import MARLHFConfig, MARLHFTrainer

args = MARLHFConfig(
    rl_algorithm="magrpo",
    num_generations=2,
    num_train_epochs=1,
    preference_num_candidates=2,
    preference_pairs_per_sample=1,
    reward_model_name=MODEL,
    reward_num_train_epochs=1,
    reward_train_batch_size=2,
    max_new_tokens=4,
    eval_interval=0,
    eval_num_samples=1,
)
trainer = MARLHFTrainer(
    agent_model=MODEL,
    num_agents=2,
    train_dataset=train_data,
    eval_dataset=eval_data,
    reward_func=reward_func,
    formatters=formatters,
    args=args,
)
trainer.train()
