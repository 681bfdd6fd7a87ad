"""Every example in the estimators' docstrings runs and prints what it shows."""

import doctest

import pytest

import skcep.linear_model


@pytest.mark.parametrize("module", [skcep.linear_model])
def test_docstring_examples(module):
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
