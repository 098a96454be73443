"""The centralized comparator adapter (docs/preference.md §5.4, §5.5, §13.1): prompt text, parser, split helpers."""

from __future__ import annotations

import pickle
import re

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from comlrl_lightning.comparators.centralized import (
    CentralizedComparatorAdapter,
    CentralizedComparatorParseError,
    TaggedCentralizedComparatorAdapter,
    build_centralized_prompt,
    parse_for_reward,
    split_joint_completions,
)

ADAPTER = TaggedCentralizedComparatorAdapter()


def test_prompt_text_matches_upstream_exactly():
    expected = (
        "You are a centralized coordinator producing the separate outputs of 2 agents.\n"
        "\n"
        "Each output must satisfy its corresponding original prompt. Keep the outputs separate;\n"
        "do not merge them or add commentary outside the required tags.\n"
        "\n"
        "Agent 0 original prompt:\n"
        "Write a haiku.\n"
        "\n"
        "Agent 1 original prompt:\n"
        "Title it.\n"
        "\n"
        "Return exactly one section for each agent in this format:\n"
        "<agent_0>\n"
        "...\n"
        "</agent_0>\n"
        "<agent_1>\n"
        "...\n"
        "</agent_1>\n"
    )
    assert ADAPTER.build_prompt({"ignored": True}, ["Write a haiku.", "Title it."]) == expected


def test_tagged_adapter_is_domain_neutral_and_supports_more_agents():  # upstream test 1
    prompt = ADAPTER.build_prompt({"id": 1}, ["first role", "second role", "third role"])
    assert "Agent 0 original prompt" in prompt and "<agent_2>" in prompt
    assert "auxiliary" not in prompt.lower()
    text = "<agent_0>a</agent_0><agent_1>b</agent_1><agent_2>c</agent_2>"
    assert ADAPTER.parse_completion(text, {}, 3) == ["a", "b", "c"]


def test_rejects_untagged_output_with_the_raw_text():  # upstream test 2
    with pytest.raises(CentralizedComparatorParseError) as info:
        ADAPTER.parse_completion("plain text", {}, 2)
    error = info.value
    assert isinstance(error, ValueError)
    assert str(error).startswith("Centralized completion did not contain any indexed agent sections.")
    assert "'plain text'" in str(error) and error.text == "plain text"
    clone = pickle.loads(pickle.dumps(error))
    assert clone.text == "plain text" and str(clone) == str(error)


def test_long_raw_text_is_truncated_in_the_message_but_kept_on_the_error():
    text = "x" * 5000
    with pytest.raises(CentralizedComparatorParseError) as info:
        ADAPTER.parse_completion(text, {}, 2)
    assert "[truncated]" in str(info.value) and len(str(info.value)) < 1500 and info.value.text == text


def test_parser_matches_spec_example():
    text = "<AGENT_0 > hi\n</ agent_0> <agent_1>there</agent_1> <agent_1>second</agent_1>"
    assert ADAPTER.parse_completion(text, {}, 3) == ["hi", "there", ""]
    assert ADAPTER.parse_completion(b"< Agent_1 >\n multi\nline \n< / AGENT_1 >", {}, 2) == [
        "",
        "multi\nline",
    ]


def test_index_is_not_a_prefix_match():
    with pytest.raises(CentralizedComparatorParseError):
        ADAPTER.parse_completion("<agent_10>x</agent_10>", {}, 2)
    assert ADAPTER.parse_completion("<agent_10>x</agent_10>", {}, 11)[10] == "x"


def test_parser_rejects_bad_arguments_without_a_parse_error():
    for num_agents in (0, -1, True):
        with pytest.raises(ValueError) as info:
            ADAPTER.parse_completion("<agent_0>a</agent_0>", {}, num_agents)
        assert not isinstance(info.value, CentralizedComparatorParseError)
    with pytest.raises(TypeError):
        ADAPTER.parse_completion(None, {}, 2)


def test_tagged_adapter_satisfies_the_protocol():
    assert isinstance(ADAPTER, CentralizedComparatorAdapter)


# --------------------------------------------------------------------------- split helpers


class SuffixAdapter:
    def build_prompt(self, item, prompts):
        return ""

    def parse_completion(self, text, item, num_agents):
        return [f"{text}-agent-{i}" for i in range(num_agents)]


def test_split_keeps_candidate_agent_alignment():  # upstream test 5
    out = split_joint_completions(SuffixAdapter(), ["candidate-0", "candidate-1"], {}, 2)
    assert out == [
        ["candidate-0-agent-0", "candidate-1-agent-0"],
        ["candidate-0-agent-1", "candidate-1-agent-1"],
    ]


@pytest.mark.parametrize(
    ("returned", "error", "needle"),
    [
        (["only one"], ValueError, "must return exactly 2 outputs; got 1"),  # upstream test 6
        ("a string", TypeError, "not a single string"),
        (["a", 3], TypeError, "must all be strings"),
    ],
)
def test_split_validates_adapter_output(returned, error, needle):
    class Bad(SuffixAdapter):
        def parse_completion(self, text, item, num_agents):
            return returned

    with pytest.raises(error, match=needle):
        split_joint_completions(Bad(), ["t"], {}, 2)


def test_split_propagates_parse_errors_and_rejects_no_candidates():
    good = ADAPTER.format_completion(["a", "b"])
    with pytest.raises(CentralizedComparatorParseError):
        split_joint_completions(ADAPTER, [good, "untagged"], {}, 2)
    with pytest.raises(ValueError, match="Centralized comparator produced no candidates."):
        split_joint_completions(ADAPTER, [], {}, 2)


def test_collaboration_reward_parse_turns_parse_errors_into_empty_outputs():
    assert parse_for_reward(ADAPTER, "untagged", {}, 3) == ["", "", ""]
    assert parse_for_reward(ADAPTER, "<agent_1>b</agent_1>", {}, 2) == ["", "b"]

    class TwoOutputs(SuffixAdapter):
        def parse_completion(self, text, item, num_agents):
            return ["a", "b"]

    with pytest.raises(ValueError, match="Centralized adapter must return exactly 3 outputs."):
        parse_for_reward(TwoOutputs(), "t", {}, 3)


def test_build_prompt_must_be_non_empty():
    assert build_centralized_prompt(ADAPTER, {}, ("a", "b")).startswith("You are a centralized coordinator")
    with pytest.raises(ValueError, match="build_prompt must return a non-empty string"):
        build_centralized_prompt(SuffixAdapter(), {}, ["a"])


# --------------------------------------------------------------------------- properties

TAG = re.compile(r"<\s*/?\s*agent_\d+\s*>", re.IGNORECASE)
tag_soup = st.lists(
    st.sampled_from(
        [
            "<",
            ">",
            "/",
            " ",
            "\n",
            "agent_",
            "AGENT_",
            "Agent_",
            "0",
            "1",
            "2",
            "10",
            "x",
            "é",
            "<agent_0>",
            "</agent_0>",
            "< agent_1 >",
            "</ AGENT_1>",
            "<agent_2",
            "agent_3>",
        ]
    )
    | st.text(max_size=5),
    max_size=30,
).map("".join)


@settings(max_examples=300, deadline=None, database=None)
@given(text=st.one_of(st.text(), tag_soup, st.binary()), num_agents=st.integers(1, 5))
def test_parser_never_crashes(text, num_agents):
    try:
        outputs = ADAPTER.parse_completion(text, {}, num_agents)
    except CentralizedComparatorParseError as error:
        assert error.text == (text.decode("utf-8", "replace") if isinstance(text, bytes) else text)
    else:
        assert len(outputs) == num_agents and all(isinstance(o, str) for o in outputs)
        assert any(outputs) or TAG.search(text if isinstance(text, str) else text.decode("utf-8", "replace"))


role_text = st.one_of(st.text(), tag_soup)


@settings(max_examples=300, deadline=None, database=None)
@given(texts=st.lists(role_text, min_size=1, max_size=5))
def test_builder_format_round_trips(texts):
    assume(not any(TAG.search(t) for t in texts))
    completion = ADAPTER.format_completion(texts)
    assert ADAPTER.parse_completion(completion, {"any": "item"}, len(texts)) == [t.strip() for t in texts]
    # The format the prompt asks for is the one format_completion writes.
    prompt = ADAPTER.build_prompt({}, [f"prompt {i}" for i in range(len(texts))])
    assert ADAPTER.format_completion(["..."] * len(texts)) in prompt


@settings(max_examples=100, deadline=None, database=None)
@given(texts=st.lists(role_text, min_size=2, max_size=4), extra=st.text(max_size=20))
def test_round_trip_survives_surrounding_chatter_and_case(texts, extra):
    assume(not any(TAG.search(t) for t in texts) and not TAG.search(extra))
    tagged = re.sub(r"<(/?)agent_(\d+)>", r"<\1 AGENT_\2 >", ADAPTER.format_completion(texts))
    completion = f"{extra}\n{tagged}\n{extra}"
    assert ADAPTER.parse_completion(completion, {}, len(texts)) == [t.strip() for t in texts]
