"""IAC and MAAC as in CoMLRL: one sample per agent per turn, learned critics."""

from _task import MODEL, eval_data, formatters, reward_func, train_data

from comlrl_lightning.trainers.actor_critic import IACConfig, IACTrainer, MAACConfig, MAACTrainer

for trainer_cls, config_cls in ((IACTrainer, IACConfig), (MAACTrainer, MAACConfig)):
    args = config_cls(
        num_agents=2,
        num_turns=1,
        num_train_epochs=1,
        rollout_buffer_size=2,
        max_new_tokens=4,
        eval_interval=0,
        eval_num_samples=1,
    )
    trainer = trainer_cls(
        agent_model=MODEL,
        critic_model=MODEL,
        reward_func=reward_func,
        formatters=formatters,
        train_dataset=train_data[:2],
        eval_dataset=eval_data,
        args=args,
    )
    trainer.train()
