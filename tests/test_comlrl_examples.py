"""CoMLRL 1.4.3's own examples (`examples/*.py`) and the Python of its documentation pages, from its PyPI sdist, run
through `trl_multiagent.comlrl` by `tests/comlrl_examples/run_comlrl_examples.py`: one case per example script and per
docs section, each in a fresh interpreter, with only the import changed and the harness's listed edits (tiny local
models, tiny sizes, W&B off). Each case's outcome is asserted: it passes, or it fails in the block and with the error
that `tests/comlrl_examples/expected_failures.txt` lists, for the reason given there.

The cases marked `ci` in `tests/comlrl_examples/cases.txt` run in the default suite; the others are `slow`. CoMLRL's
sdist: $COMLRL_SDIST (the .tar.gz or its unpacked folder), else the contract harness's cache path, downloaded there
with pip when missing; without it the tests skip, saying what is missing (also in the run's last lines).
"""

from types import SimpleNamespace

import pytest
from comlrl_examples import run_comlrl_examples as harness
from conftest import skipped_comlrl_examples


CASES = harness.read_case_list()
EXPECTED = harness.load_expected()


def run_within() -> dict[str, str]:
    """{case: the case that runs it}: on a tutorial page each section's case runs every earlier section first, so the
    page's last case runs all of its blocks, in the same order, in one script; the earlier cases are not run again on
    their own (each is checked to be a prefix of the last, and to be expected to pass)."""
    within = {}
    for page in harness.TUTORIAL_PAGES:
        on_page = [case for case in CASES if case.startswith(f"{page}#")]
        within.update(dict.fromkeys(on_page[:-1], on_page[-1]))
    return within


RUN_WITHIN = run_within()


@pytest.fixture(scope="session")
def comlrl_examples(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("comlrl_examples")
    try:
        root = harness.unpacked_sdist(harness.sdist_source(), workdir)
    except harness.HarnessError as error:
        skipped_comlrl_examples.append(str(error))
        pytest.skip(str(error))
    cases, not_run = harness.collect(root)
    return SimpleNamespace(
        cases={case.id: case for case in cases}, not_run=not_run, workdir=workdir, models=harness.tiny_models(workdir)
    )


def test_the_sdist_gives_the_listed_cases_and_every_edit_applies(comlrl_examples):
    assert list(comlrl_examples.cases) == list(CASES)  # a new or renamed section of CoMLRL's is listed by hand
    assert set(EXPECTED) <= set(CASES)
    harness.check_edits(list(comlrl_examples.cases.values()), comlrl_examples.models)  # each edit matches
    for case in comlrl_examples.cases.values():
        script, _ = harness.edited_script(case, comlrl_examples.models)
        compile(script, case.id, "exec")
        assert not any(line.lstrip().startswith(("from comlrl", "import comlrl")) for line in script.splitlines())
    assert set(harness.SECTIONS) <= set(CASES)
    for case_id, last in RUN_WITHIN.items():  # each one's blocks run, as a prefix, inside its page's last case
        case, covering = comlrl_examples.cases[case_id], comlrl_examples.cases[last]
        sections = harness.needed_sections(case)
        assert harness.needed_sections(covering)[: len(sections)] == sections, (case_id, last)
        body = [harness.edited_script(c, comlrl_examples.models)[0].partition("\n")[2] for c in (case, covering)]
        assert body[1].startswith(body[0]), (case_id, last)  # the same code, but the first line (the case's name)
        assert case_id not in EXPECTED and not CASES[case_id], case_id
    # the blocks not run: 7 bash/json/text blocks and the 2 IAC/MAAC fragments (harness.FRAGMENTS)
    languages = sorted(block.language for _, block in comlrl_examples.not_run)
    assert languages == ["bash"] * 4 + ["json"] + ["python"] * 2 + ["text"] * 2


@pytest.mark.parametrize(
    "case_id",
    [
        pytest.param(case, marks=() if ci else pytest.mark.slow, id=case)
        for case, ci in CASES.items()
        if case not in RUN_WITHIN
    ],
)
def test_case_outcome(comlrl_examples, case_id):
    result = harness.run_case(comlrl_examples.cases[case_id], comlrl_examples.workdir, comlrl_examples.models)
    problem = harness.verdict(result, EXPECTED.get(case_id))
    stderr = open(f"{result.folder}/stderr.log").read()[-3000:]
    assert not problem, f"{problem}\n(the case's folder: {result.folder})\n{stderr}"


def test_an_outcome_is_the_expected_one_only_where_and_how_listed():
    listed = harness.Expected("#setup.1", "NotProvidedError: IACConfig", "[not-provided] why")

    def result(outcome, block="#setup.1", error="x.NotProvidedError: IACConfig (CoMLRL 1.4.3's ...)"):
        return harness.Result("case", outcome, block, error if outcome != "passed" else "", 1.0, "folder")

    assert harness.verdict(result("passed"), None) == ""
    assert harness.verdict(result("failed"), listed) == ""
    assert "expected to pass" in harness.verdict(result("failed"), None)
    assert "but passed" in harness.verdict(result("passed"), listed)
    assert "listed as failing in #setup.1" in harness.verdict(result("failed", block="#setup.2"), listed)
    assert "listed as failing" in harness.verdict(result("failed", error="TypeError: other"), listed)
    assert "listed as failing" in harness.verdict(result("timeout"), listed)
