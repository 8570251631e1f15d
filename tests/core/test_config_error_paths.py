"""Config problems take their TOML paths from cattrs' structured errors (the field name or list
index each inner error carries), not from text: a key holding any character keeps its path."""

from __future__ import annotations

from tests.core.test_config import MINIMAL, problems_of


def test_a_quoted_key_with_control_characters_is_one_problem_with_its_path(tzrun_pm):
    # TOML allows any character in a quoted key; the problem still names it whole, once
    text = MINIMAL.replace('[data]\n', '[data]\n"odd\\u0000key\\u0001two" = 1\n')
    problems = problems_of(text, pm=tzrun_pm)
    assert len(problems) == 1, problems
    assert problems[0].startswith("data.odd\x00key\x01two: unknown key (known keys: ")


def test_paths_through_arrays_and_components(tzrun_pm):
    problems = problems_of(MINIMAL, 'features.sparse[0].embeding_dim=8', 'metrics[0].bogus=1',
                           'data.batch_size="x"', pm=tzrun_pm)
    assert any(p.startswith("features.sparse[0].embeding_dim: unknown key") and "did you mean 'embedding_dim'" in p
               for p in problems), problems
    assert any(p.startswith("metrics[0].bogus: unknown key") for p in problems), problems
    assert 'data.batch_size: expected an integer, got "x"' in problems, problems
