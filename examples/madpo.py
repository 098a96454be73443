"""MADPO as in CoMLRL: offline preference pairs from the task reward, then DPO on every agent."""

from _task import MODEL, eval_data, formatters, reward_func, train_data

from comlrl_lightning.trainers.preference import MADPOConfig, MADPOTrainer

args = MADPOConfig(
    num_train_epochs=1,
    preference_num_candidates=2,
    preference_pairs_per_sample=1,
    max_new_tokens=4,
    eval_interval=0,
    eval_num_samples=2,
    logging_steps=1,
)
trainer = MADPOTrainer(
    agent_model=MODEL,
    num_agents=2,
    train_dataset=train_data,
    eval_dataset=eval_data,
    reward_func=reward_func,
    formatters=formatters,
    args=args,
)
trainer.train()
trainer.save_model("outputs/madpo")
