"""The rollout tree without a model: returns, advantages, cross-mode credit, call counts
(docs/multiturn.md §2.2-2.7)."""

from __future__ import annotations

import pytest

from comlrl_lightning.multiturn.tree import AgentDraw, Node, build_tree, build_trees, joint_actions, node_samples


class Recorder:
    """Injected sample / reward / transition callables that count their calls."""

    def __init__(self, num_generations: int, reward_of=None):
        self.k = num_generations
        self.samples = 0
        self.rewards = 0
        self.transitions: list[tuple] = []
        self.reward_of = reward_of or (lambda texts, turn, path: 0.0)

    def sample(self, agent, turn, prompt, used):
        self.samples += 1
        texts = [f"a{agent} t{turn} k{j} | {prompt}" for j in range(self.k)]
        return AgentDraw(prompt, used, [1, 2], [[10 + j] for j in range(self.k)], texts)

    def reward(self, prompts, texts, turn, path):
        self.rewards += 1
        return self.reward_of(texts, turn, path)

    def transition(self, texts, p_hist, r_hist, turn, path):
        self.transitions.append((texts, p_hist, r_hist, turn, path))
        return [(f"next{a} {path}", f"raw{a} {path}") for a in range(len(texts))]


def run(n, k, t, mode, rec, threshold=None):
    return build_tree(n, k, t, mode, [(f"p{a}", f"p{a}") for a in range(n)], rec.sample, rec.reward,
                      rec.transition if t > 1 else None, early_termination_threshold=threshold)


@pytest.mark.parametrize("mode,n,k,t", [("aligned", 2, 4, 2), ("cross", 2, 4, 2), ("aligned", 2, 3, 3),
                                        ("cross", 2, 2, 3), ("aligned", 3, 2, 2), ("cross", 3, 2, 2)])
def test_call_counts_match_spec_formulas(mode, n, k, t):
    rec = Recorder(k)
    root, env_step = run(n, k, t, mode, rec)
    b = k if mode == "aligned" else k ** n
    assert rec.samples == n * sum(b ** i for i in range(t))
    assert rec.rewards == sum(b ** (i + 1) for i in range(t))
    assert len(rec.transitions) == sum(b ** (i + 1) for i in range(t - 1))
    assert env_step == sum(b ** (i + 1) for i in range(t))
    nodes = list(root.walk())
    assert len(nodes) == sum(b ** i for i in range(t))
    assert [nd.env_step for nd in nodes] == sorted(nd.env_step for nd in nodes)
    assert len(node_samples(root, n, k, "mean", True)) == n * len(nodes)


def test_spec_example_counts():
    # docs/multiturn.md §2.3: N=2, K=4, T=2 -> aligned 5 nodes/10/20/4, cross 17 nodes/34/272/16.
    for mode, expected in (("aligned", (5, 10, 20, 4)), ("cross", (17, 34, 272, 16))):
        rec = Recorder(4)
        root, _ = run(2, 4, 2, mode, rec)
        assert (len(list(root.walk())), rec.samples, rec.rewards, len(rec.transitions)) == expected


def test_early_termination_counts_and_default_off():
    # Reward 1 on every node below the root's joint action 0, else 0; threshold 0.5 (strict >).
    def reward_of(texts, turn, path):
        return 1.0 if turn >= 1 and path[0] == (0, 0) else 0.0

    rec = Recorder(3, reward_of)
    root, env_step = run(2, 3, 3, "aligned", rec, threshold=0.5)
    # root expands (mean 0); child 0 terminates (mean 1 > 0.5); children 1 and 2 expand into 3 leaves each.
    assert [c.terminated for c in root.children] == [True, False, False]
    assert len(list(root.walk())) == 1 + 3 + 6
    assert rec.samples == 2 * 10 and rec.rewards == 3 * 10 and len(rec.transitions) == 3 + 6
    assert env_step == 30
    # the terminated child is a leaf: its returns are its rewards
    assert root.children[0].returns == [1.0, 1.0, 1.0]
    # exactly at the threshold does not terminate (strict >); None never terminates
    rec2 = Recorder(2, lambda *a: 0.5)
    root2, _ = run(2, 2, 2, "aligned", rec2, threshold=0.5)
    assert len(root2.children) == 2
    rec3 = Recorder(2, lambda *a: 100.0)
    root3, _ = run(2, 2, 2, "aligned", rec3, threshold=None)
    assert len(root3.children) == 2
    rec4 = Recorder(2, lambda *a: 1.0)
    root4, _ = run(2, 2, 2, "cross", rec4, threshold=0.0)
    assert root4.terminated and not root4.children and rec4.samples == 2 and rec4.rewards == 4


def test_returns_and_advantages_on_hand_built_tree():
    # aligned, N=2, K=2, T=2. Root rewards [1, 0]; child of j=0: [2, 4]; child of j=1: [0, 1].
    table = {(): [1.0, 0.0], ((0, 0),): [2.0, 4.0], ((1, 1),): [0.0, 1.0]}

    def reward_of(texts, turn, path):
        return table[path[:-1]][path[-1][0]]

    rec = Recorder(2, reward_of)
    root, _ = run(2, 2, 2, "aligned", rec)
    assert root.rewards == [1.0, 0.0]
    assert root.children[0].returns == [2.0, 4.0] and root.children[1].returns == [0.0, 1.0]
    assert root.returns == [1.0 + 3.0, 0.0 + 0.5]  # r + mean of the child's returns (undiscounted)
    samples = node_samples(root, 2, 2, "mean", normalize=False)
    assert [s.agent for s in samples] == [0, 1] * 3 and [s.turn for s in samples] == [0, 0, 1, 1, 1, 1]
    assert samples[0].returns == samples[1].returns == [4.0, 0.5]  # aligned: same vector for every agent
    assert samples[0].advantages == pytest.approx([1.75, -1.75])
    assert samples[2].advantages == pytest.approx([-1.0, 1.0])
    assert samples[0].node_mean_reward == 0.5 and samples[0].node_mean_return == 2.25
    normed = node_samples(root, 2, 2, "mean", normalize=True)
    assert normed[0].advantages == pytest.approx([1.0, -1.0])
    # the four baselines of docs/multiturn.md §3 without normalisation on the root group G = [4, 0.5]
    assert node_samples(root, 2, 2, "raw", False)[0].advantages == pytest.approx([4.0, 0.5])
    assert node_samples(root, 2, 2, "max", False)[0].advantages == pytest.approx([0.0, -3.5])
    assert node_samples(root, 2, 2, "rloo", False)[0].advantages == pytest.approx([3.5, -3.5])
    # ...and all identical after normalisation
    for mode in ("raw", "max", "rloo"):
        assert node_samples(root, 2, 2, mode, True)[0].advantages == pytest.approx([1.0, -1.0])


def test_cross_mode_credit_is_a_sum_over_partner_completions():
    # N=2, K=2, T=1: joint actions (0,0),(0,1),(1,0),(1,1) with rewards 1, 2, 3, 5.
    rewards = {(0, 0): 1.0, (0, 1): 2.0, (1, 0): 3.0, (1, 1): 5.0}
    rec = Recorder(2, lambda texts, turn, path: rewards[path[-1]])
    root, env_step = run(2, 2, 1, "cross", rec)
    assert root.joint == [(0, 0), (0, 1), (1, 0), (1, 1)] and env_step == 4
    s0, s1 = node_samples(root, 2, 2, "raw", normalize=False)
    assert s0.returns == [1.0 + 2.0, 3.0 + 5.0]  # agent 0: its completion k with every partner completion
    assert s1.returns == [1.0 + 3.0, 2.0 + 5.0]  # agent 1
    m0, m1 = node_samples(root, 2, 2, "mean", normalize=False)
    assert m0.advantages == pytest.approx([-2.5, 2.5]) and m1.advantages == pytest.approx([-1.5, 1.5])
    # the reward saw the texts of the right completions
    assert joint_actions(2, 2, "cross") == root.joint


def test_cross_mode_two_turns_returns():
    # Child rewards depend on the branch; the root return adds the mean of its child's 4 returns.
    def reward_of(texts, turn, path):
        if turn == 0:
            return 0.0
        first = path[0]
        return float(first[0] * 2 + first[1])  # every child joint action of branch (i, j) gets 2i + j

    rec = Recorder(2, reward_of)
    root, _ = run(2, 2, 2, "cross", rec)
    assert root.returns == [0.0, 1.0, 2.0, 3.0]
    s0, s1 = node_samples(root, 2, 2, "raw", normalize=False)[:2]
    assert s0.returns == [1.0, 5.0] and s1.returns == [2.0, 4.0]


def test_transition_sees_its_own_branch_history():
    rec = Recorder(2)
    _root, _ = run(2, 2, 3, "aligned", rec)
    texts, p_hist, r_hist, turn, path = rec.transitions[0]
    assert turn == 0 and path == ((0, 0),)
    assert p_hist == [["p0"], ["p1"]]
    assert r_hist == [[texts[0]], [texts[1]]] and texts[0].startswith("a0 t0 k0")
    # the first grandchild transition: the branch's history has two turns; the prompt history records the
    # raw string the transition returned ("prompt used"), the generation saw the formatted one
    _texts2, p_hist2, r_hist2, turn2, path2 = next(tr for tr in rec.transitions if tr[4] == ((0, 0), (0, 0)))
    assert turn2 == 1
    assert p_hist2[0] == ["p0", "raw0 ((0, 0),)"]
    assert r_hist2[0][0].startswith("a0 t0 k0") and r_hist2[0][1].startswith("a0 t1 k0 | next0 ((0, 0),)")
    # second root branch starts from completion 1 of each agent
    branch1 = next(tr for tr in rec.transitions if tr[4] == ((1, 1),))
    assert branch1[2][1][0].startswith("a1 t0 k1")


def test_multiturn_without_transition_and_unknown_mode_are_errors():
    rec = Recorder(2)
    with pytest.raises(ValueError, match="external_transition"):
        build_tree(2, 2, 2, "aligned", [("p", "p")] * 2, rec.sample, rec.reward, None)
    with pytest.raises(ValueError, match="joint_mode"):
        joint_actions(2, 2, "diagonal")


# --- level-batched construction (docs/multiturn.md §2.2) ----------------------------------------------------

def depth_first_tree(n, k, t, mode, root_prompts, sample, reward, transition, threshold=None, env_step=0):
    """The reference: the historical depth-first pre-order builder, one ``sample`` call per agent per node."""
    joint = joint_actions(n, k, mode)
    counter = [env_step]

    def build(turn, prompts, p_hist, r_hist, path):
        draws = [sample(a, turn, prompts[a][0], prompts[a][1]) for a in range(n)]
        used = [d.prompt_used for d in draws]
        rewards = [float(reward([used[0]], [draws[a].texts[ja[a]] for a in range(n)], turn, path + (ja,)))
                   for ja in joint]
        counter[0] += len(joint)
        node = Node(turn=turn, path=path, draws=draws, joint=joint, rewards=rewards, env_step=counter[0])
        if threshold is not None:
            node.terminated = node.mean_reward > threshold
        if turn < t - 1 and not node.terminated:
            new_p = [p_hist[a] + [used[a]] for a in range(n)]
            for ja in joint:
                texts = [draws[a].texts[ja[a]] for a in range(n)]
                new_r = [r_hist[a] + [texts[a]] for a in range(n)]
                nxt = transition(texts, new_p, new_r, turn, path + (ja,))
                node.children.append(build(turn + 1, nxt, new_p, new_r, path + (ja,)))
        node.returns = [r + (node.children[j].mean_return if node.children else 0.0) for j, r in enumerate(rewards)]
        return node

    root = build(0, list(root_prompts), [[] for _ in range(n)], [[] for _ in range(n)], ())
    return root, counter[0]


def prompt_sampler(k):
    """Deterministic draws that depend only on (agent, turn, prompt): the same in any call order."""
    def sample(agent, turn, prompt, used):
        h = sum(map(ord, prompt)) % 97
        texts = [f"a{agent} t{turn} k{j} h{(h * (j + 3)) % 11} | {prompt[-40:]}" for j in range(k)]
        return AgentDraw(prompt, used, [1, h], [[10 + j, h] for j in range(k)], texts,
                         kls=[0.01 * ((h + j) % 5) for j in range(k)])
    return sample


def text_reward(prompts, texts, turn, path):
    return float(sum(sum(map(ord, x)) % 7 for x in texts) + turn) / 3.0


def text_transition(texts, p_hist, r_hist, turn, path):
    return [(f"T{turn} {texts[a][:12]} {len(p_hist[a])}", f"raw{a} {texts[a][:8]}") for a in range(len(texts))]


def same_tree(x, y):
    assert len(list(x.walk())) == len(list(y.walk()))
    for u, v in zip(x.walk(), y.walk()):
        assert (u.turn, u.path, u.joint, u.rewards, u.env_step, u.terminated, u.returns) == \
               (v.turn, v.path, v.joint, v.rewards, v.env_step, v.terminated, v.returns)
        assert [(d.prompt, d.prompt_used, d.completion_ids, d.texts) for d in u.draws] == \
               [(d.prompt, d.prompt_used, d.completion_ids, d.texts) for d in v.draws]


@pytest.mark.parametrize("mode,n,k,t,threshold", [("aligned", 2, 4, 2, None), ("cross", 2, 2, 3, None),
                                                  ("aligned", 3, 2, 3, 2.0), ("cross", 2, 3, 2, 2.5),
                                                  ("aligned", 1, 3, 3, None)])
def test_level_batched_tree_equals_depth_first_tree(mode, n, k, t, threshold):
    sample = prompt_sampler(k)
    roots = [(f"p{a}", f"p{a}") for a in range(n)]
    ref, ref_step = depth_first_tree(n, k, t, mode, roots, sample, text_reward, text_transition, threshold, 7)
    calls = []

    def sample_level(agent, turn, prompts):
        calls.append((agent, turn, len(prompts)))
        return [sample(agent, turn, p, u) for p, u in prompts]

    root, step = build_tree(n, k, t, mode, roots, None, text_reward, text_transition if t > 1 else None,
                            early_termination_threshold=threshold, env_step=7, sample_level=sample_level)
    assert step == ref_step
    same_tree(root, ref)
    kl = 0.3
    for norm in (True, False):
        assert node_samples(root, n, k, "mean", norm, kl) == node_samples(ref, n, k, "mean", norm, kl)
    # one call per agent per level, each covering every node of the level
    per_turn = {}
    for nd in root.walk():
        per_turn[nd.turn] = per_turn.get(nd.turn, 0) + 1
    assert calls == [(a, turn, per_turn[turn]) for turn in sorted(per_turn) for a in range(n)]


@pytest.mark.parametrize("mode", ["aligned", "cross"])
def test_several_trees_share_each_level_call(mode):
    n, k, t = 2, 2, 3
    sample = prompt_sampler(k)
    items = [[(f"item{i} p{a}", f"item{i} p{a}") for a in range(n)] for i in range(3)]
    calls = []

    def sample_level(agent, turn, prompts):
        calls.append((agent, turn, len(prompts)))
        return [sample(agent, turn, p, u) for p, u in prompts]

    seen_trees = set()

    def reward(tree, prompts, texts, turn, path):
        seen_trees.add(tree)
        assert prompts[0].startswith(f"item{tree}") or turn > 0
        return text_reward(prompts, texts, turn, path)

    roots, step = build_trees(n, k, t, mode, items, sample_level, reward,
                              lambda tree, *args: text_transition(*args), env_step=3)
    b = k if mode == "aligned" else k ** n
    nodes_per_turn = [3 * b ** turn for turn in range(t)]
    assert calls == [(a, turn, nodes_per_turn[turn]) for turn in range(t) for a in range(n)]
    assert seen_trees == {0, 1, 2}
    # each tree equals its own depth-first tree; env_steps continue from one tree to the next
    before = 3
    for i, root in enumerate(roots):
        ref, before = depth_first_tree(n, k, t, mode, items[i], sample, text_reward, text_transition,
                                       env_step=before)
        same_tree(root, ref)
    assert step == before


def test_level_sampler_must_return_one_draw_per_node():
    sample = prompt_sampler(2)
    with pytest.raises(ValueError, match="one per node"):
        build_tree(2, 2, 2, "aligned", [("p", "p")] * 2, None, text_reward, text_transition,
                   sample_level=lambda a, t, prompts: [sample(a, t, *prompts[0])])
