"""The results filter read from query parameters, by itself (``api.browse.result_filter``):
blank values are absent, flags and fractions read at their edges, every other value
refused naming its choices. (The routes that take it: tests/api/test_review_api.py.)"""

from __future__ import annotations

import pytest

from api.browse import result_filter
from common.errors import InvalidInput


def test_blank_values_are_absent_not_refused():
    found = result_filter({"status": "  ", "who": "", "sort": " ", "q": "\t"})
    assert (found.status, found.who, found.text, found.sort) == (None, None, None, "position")


def test_given_values_are_kept_and_the_sort_defaults_to_position():
    found = result_filter({"status": "done", "who": "small", "sort": "-confidence"})
    assert (found.status, found.who, found.sort) == ("done", "small", "-confidence")
    assert result_filter({}).sort == "position"


@pytest.mark.parametrize(
    ("text", "meant"), [("1", True), ("yes", True), ("0", False), ("no", False)]
)
def test_flags_read_yes_and_no(text, meant):
    found = result_filter({"wrong": text, "disagree": text, "reviewed": text})
    assert (found.wrong, found.disagree, found.reviewed) == (meant, meant, meant)


def test_absent_flags_filter_nothing():
    found = result_filter({})
    assert (found.wrong, found.disagree, found.reviewed) == (False, False, None)


@pytest.mark.parametrize("text", ["0", "0.0", "1", "1.0", "0.5"])
def test_a_fraction_from_0_to_1_is_taken_edges_included(text):
    assert result_filter({"conf_min": text, "conf_max": text}).conf_min == float(text)


@pytest.mark.parametrize("text", ["-0.01", "1.01", "abc", "nan"])
def test_a_fraction_outside_0_to_1_or_not_a_number_is_refused(text):
    with pytest.raises(InvalidInput, match="give a number from 0 to 1"):
        result_filter({"conf_max": text})


@pytest.mark.parametrize("params", [{"status": "sleeping"}, {"sort": "age"}, {"wrong": "maybe"}])
def test_any_other_value_is_refused_as_a_bad_filter(params):
    with pytest.raises(InvalidInput) as refused:
        result_filter(params)
    assert refused.value.code == "bad_filter"
