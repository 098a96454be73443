"""Multi-turn MAGRPO as in CoMLRL: a two-turn rollout tree, an external transition, custom eval metrics."""

from _task import MODEL, eval_data, formatters, reward_func, train_data

from comlrl_lightning.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer


def external_transition(prompt, agent_completions, num_agents, prompt_history_per_agent=None,
                        response_history_per_agent=None):
    """Next-turn prompt per agent: the task, the previous answers, and a revise instruction."""
    joint = " | ".join(agent_completions)
    return [f"{prompt}\nPrevious answers: {joint}\nRevise your part:" for _ in range(num_agents)]


def eval_logger(agent_completions_turns, batch_items, prompts):
    """One metrics dict per evaluation item."""
    return [{"last_turn_chars": float(len(agent_completions_turns[1][k][-1]))} for k in range(len(prompts))]


def eval_aggregator(metrics, num_turns):
    """Reduce the per-item dicts; keys are logged as eval/<key>."""
    return {f"turn_{num_turns}/last_turn_chars": sum(m["last_turn_chars"] for m in metrics) / len(metrics)}


args = MAGRPOConfig(
    num_turns=2,
    num_generations=2,
    num_train_epochs=1,
    max_new_tokens=4,
    eval_interval=0,
    eval_num_samples=1,
)
trainer = MAGRPOTrainer(
    agent_model=MODEL,
    num_agents=2,
    train_dataset=train_data[:2],
    eval_dataset=eval_data,
    reward_func=reward_func,
    formatters=formatters,
    external_transition=external_transition,
    eval_logger=eval_logger,
    eval_aggregator=eval_aggregator,
    args=args,
)
trainer.train(repetition_penalty=1.1)  # extra train() keywords go to generate, as in CoMLRL
trainer.save_model("outputs/magrpo")
