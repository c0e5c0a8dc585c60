"""``--case-file FILE.toml`` (docs/case-file.md): the example file's chain, tree, serving and
serving tree cases run beside the battery in the run's one error budget (the reference
LOSSLESS on each, a top-10-residual tree verifier LOSSY on its V = 1024 tree case, a serving
tree verifier that ignores min-p LOSSY on its min-p tree), their replay lines carry the
file and reproduce, ``list`` shows them, and a bad file exits 2 naming the file, the table and
the field. Also: a planning error names the flag the user typed (``--dtype``), not the config
field (``dtype:``).

Fast: small cases, ``--steps`` of a few hundred, targets in process.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from hypothesis import given, settings
from hypothesis import strategies as st

from losslessness.batteries.case_file import CHAIN_REGIMES, CaseFileError, read_case_file
from losslessness.checks import STATISTICAL_CHAIN_CHECK_IDS, count_statistical_assertions
from losslessness.cli import main
from losslessness.config import RunConfig
from losslessness.engine import plan_run
from losslessness.engine.draw import rows_per_call
from losslessness.requests import Request
from losslessness.targets import resolve_targets
from strategies import requests

EXAMPLE = Path(__file__).parents[2] / "docs" / "examples" / "cases.toml"
CHAIN_IDS = ("file-lm-v512-b1", "file-zeros-v12")
TREE_IDS = ("file-star4-v1024", "file-tree-wor-v6")
SERVING_ID = "file-serving-mixed"
SERVING_TREE_ID = "file-stree-eagle-min-p"


def run_cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def audit(tmp_path: Path, *args: str) -> tuple[Result, dict]:  # type: ignore[type-arg]
    path = tmp_path / "audit.json"
    result = run_cli("audit", "--no-progress", "--in-process", "--json", str(path), *args)
    return result, json.loads(path.read_text())


def checks_by_case(record: dict) -> dict[str, list[dict]]:  # type: ignore[type-arg]
    found: dict[str, list[dict]] = {}  # type: ignore[type-arg]
    for target in record["targets"]:
        for check in target["checks"]:
            found.setdefault(check["case_id"].split("[")[0], []).append(check)
    return found


def selecting(*case_ids: str) -> list[str]:
    return [arg for case_id in case_ids for arg in ("--case", case_id)]


def test_example_file_chain_cases_run_lossless_for_a_chain_function(tmp_path: Path) -> None:
    """The example's chain cases (V = 512 one row per call in float32, exact zeros in two
    distinct row types) run on ``losslessness.reference:verify``: LOSSLESS, every check on a
    file case, its replay line naming the file."""
    result, record = audit(
        tmp_path, "losslessness.reference:verify", "--case-file", str(EXAMPLE),
        *selecting(*CHAIN_IDS), "--steps", "300",
    )
    assert result.exit_code == 0, result.output
    assert record["targets"][0]["verdict"] == "LOSSLESS"
    checks = checks_by_case(record)
    assert set(CHAIN_IDS) <= set(checks)
    for case_id in CHAIN_IDS:
        for check in checks[case_id]:
            assert f"--case-file {EXAMPLE.resolve()}" in check["replay"], check["replay"]
            assert f"--case {case_id}" in check["replay"]


def test_example_file_tree_cases_run_lossless_for_a_tree_function(tmp_path: Path) -> None:
    """The example's tree cases (a star at V = 1024, a tree given by its parents drafted
    without replacement) run on ``--tree losslessness.reference.tree:verify_tree``: LOSSLESS."""
    result, record = audit(
        tmp_path, "--tree", "losslessness.reference.tree:verify_tree", "--case-file",
        str(EXAMPLE), *selecting(*TREE_IDS), "--steps", "1024",
    )
    assert result.exit_code == 0, result.output
    assert set(TREE_IDS) <= set(checks_by_case(record))


def test_top_10_residual_tree_verifier_is_lossy_on_the_files_v1024_tree(tmp_path: Path) -> None:
    """A tree verifier drawing the residual among the target's top 10 tokens only (exact at
    V <= 10) is LOSSY (exit 1, ``tree.law``) on the file's star at the user's V = 1024; the
    reference passes the same case (the test above)."""
    result, record = audit(
        tmp_path, "--tree", "losslessness.zoo.tree:residual_top_10_only", "--case-file",
        str(EXAMPLE), "--case", "file-star4-v1024",
    )
    assert result.exit_code == 1, result.output
    lossy = [c for c in checks_by_case(record)["file-star4-v1024"] if c["verdict"] == "LOSSY"]
    assert any(check["check_id"] == "tree.law" for check in lossy), result.output


def test_example_file_serving_case_runs_lossless_for_its_profile(tmp_path: Path) -> None:
    """The example's mixed serving batch (greedy, top-k + top-p, a penalty with a history,
    seeded min_tokens) on the serving reference of its profile, vllm-v1: LOSSLESS."""
    result, record = audit(
        tmp_path, "--protocol", "serving", "--engine-profile", "vllm-v1",
        "tests.commands.case_file_targets:vllm_v1_reference", "--case-file", str(EXAMPLE),
        "--case", SERVING_ID, "--steps", "200",
    )
    assert result.exit_code == 0, result.output
    assert SERVING_ID in checks_by_case(record)


@pytest.mark.parametrize(
    ("target", "exit_code"),
    [("mutant/serving-tree-reference", 0), ("mutant/serving-tree-ignores-min-p", 1),
     ("mutant/serving-tree-greedy-flag-from-any-request", 1)],
)
def test_example_file_serving_tree_case_runs_for_the_targets_profile(
    tmp_path: Path, target: str, exit_code: int
) -> None:
    """The example's EAGLE-like min-p tree at V = 2048, batched beside a greedy request, built
    for the serving tree target's profile (vllm-v1): the reference serving tree verifier is
    LOSSLESS on it; one that ignores min-p is LOSSY (a token min-p removes is emitted), and so
    is one that makes a whole batch greedy when one request is (the file's companion)."""
    result, record = audit(
        tmp_path, target, "--case-file", str(EXAMPLE), "--case", SERVING_TREE_ID,
        "--steps", "1024",
    )
    assert result.exit_code == exit_code, result.output
    checks = checks_by_case(record)[SERVING_TREE_ID]
    assert {c["check_id"] for c in checks} >= {"tree.structure", "tree.law"}
    assert "vllm-v1" in checks[0]["case_summary"]


def test_a_serving_tree_table_is_built_for_each_profile_and_dtype(tmp_path: Path) -> None:
    """The file's serving tree case is built for the profile asked (its target laws that
    profile's), its logits in the run's ``--dtype`` or the table's own; a profile that does not
    implement the request (SGLang has no bad token ids) is a CaseFileError naming the table."""
    file = read_case_file(EXAMPLE)
    vllm = file.serving_tree_cases("vllm-v1")[0]
    sglang = file.serving_tree_cases("sglang-torch", "bfloat16")[0]
    assert vllm.case_id == sglang.case_id == SERVING_TREE_ID
    assert vllm.serving is not None and sglang.serving is not None
    assert (vllm.serving.dtype, sglang.serving.dtype) == ("float32", "bfloat16")
    assert vllm.serving.profile == "vllm-v1" and sglang.serving.profile == "sglang-torch"
    assert vllm.case_hash != sglang.case_hash
    path = tmp_path / "bad-ids.toml"
    path.write_text(
        '[[serving_tree]]\nid = "t"\nshape = "chain"\nrequest = { bad_token_ids = [1] }\n'
    )
    with pytest.raises(CaseFileError, match=r"serving_tree\[0\] \(id 't'\): .*sglang-torch"):
        read_case_file(path).serving_tree_cases("sglang-torch")


def test_replay_line_of_a_file_case_reproduces_its_p_value(tmp_path: Path) -> None:
    """A lossy chain verifier's acceptance check on a file case replays, from its replay line
    alone (which carries ``--case-file``), to the same p-value."""
    result, record = audit(
        tmp_path, "tests.wrong_verifiers:ratio_inverted", "--case-file", str(EXAMPLE),
        "--case", "file-zeros-v12", "--steps", "300", "--no-early-stop",
    )
    assert result.exit_code == 1, result.output
    acceptance = {
        c["p_value"] for c in checks_by_case(record)["file-zeros-v12"]
        if c["check_id"] == "acceptance"
    }
    check = next(
        c for c in checks_by_case(record)["file-zeros-v12"]
        if c["check_id"] == "acceptance" and c["verdict"] == "LOSSY" and c["p_value"] > 0
    )
    replay_dir = tmp_path / "replay"
    replay_dir.mkdir()
    args = shlex.split(check["replay"])[2:]
    again, replayed = audit(replay_dir, *args)
    assert again.exit_code == 1, again.output
    assert {
        c["p_value"] for c in replayed["targets"][0]["checks"] if c["check_id"] == "acceptance"
    } == acceptance


def test_plan_assertion_count_includes_the_files_cases() -> None:
    """The file's chain cases share the run's one error budget: the plan with them counts
    exactly their statistical assertions more than the plan without them."""
    targets = resolve_targets(["losslessness.reference:verify"], in_process=True)
    base = plan_run(RunConfig(cases=("v8-far",)), targets)
    with_file = plan_run(
        RunConfig(cases=("v8-far", *CHAIN_IDS), case_file=str(EXAMPLE)), targets
    )
    added = sum(
        count_statistical_assertions(case, rows_per_call(case), STATISTICAL_CHAIN_CHECK_IDS)
        for case in read_case_file(EXAMPLE).chain_cases()
    )
    assert added > 0
    assert with_file.record.n_assertions == base.record.n_assertions + added
    assert with_file.record.per_assertion_alpha < base.record.per_assertion_alpha
    assert {case.case_id for case in with_file.chain_cases} == {"v8-far", *CHAIN_IDS}


def test_list_shows_the_files_cases() -> None:
    """``list --case-file`` lists every case of the file with its protocol."""
    result = CliRunner().invoke(main, ["list", "--case-file", str(EXAMPLE)], terminal_width=250)
    assert result.exit_code == 0, result.output
    for case_id in (*CHAIN_IDS, *TREE_IDS, SERVING_ID, SERVING_TREE_ID):
        assert case_id in result.output


BAD_FILES = [
    ("missing id", "[[chain]]\nvocab_size = 8\n", "chain[0]: id: missing"),
    ("duplicate id", '[[chain]]\nid = "a"\n[[tree]]\nid = "a"\nshape = "chain"\n',
     "tree[0] (id 'a'): id: duplicate id 'a'"),
    ("unknown field", '[[chain]]\nid = "a"\nvocab = 8\n', "chain[0] (id 'a'): vocab: unknown"),
    ("wrong type", '[[tree]]\nid = "t"\nshape = "chain"\nvocab_size = "big"\n',
     "tree[0] (id 't'): vocab_size: must be an integer, got 'big'"),
    ("out of range", '[[chain]]\nid = "a"\n[[chain]]\nid = "b"\n[[chain]]\nid = "c"\n'
     "vocab_size = 1\n", "chain[2] (id 'c'): vocab_size: must be in [2, 262144], got 1"),
    ("unknown regime", '[[chain]]\nid = "a"\nregime = "spiky"\n',
     "chain[0] (id 'a'): regime: must be one of dense"),
    ("serving row field", '[[serving]]\nid = "s"\n[[serving.rows]]\ntop_p = 1.5\n',
     "serving[0] (id 's'): rows[0].top_p: top_p=1.5 must be <= 1.0"),
    ("unsupported request", '[[serving]]\nid = "s"\nprofile = "llama.cpp"\n[[serving.rows]]\n'
     "min_tokens = 2\nstop_token_ids = [0]\n",
     "serving[0] (id 's'): rows[0].request: profile 'llama.cpp' does not implement it"),
    ("serving tree penalty", '[[serving_tree]]\nid = "t"\nshape = "chain"\n'
     "[serving_tree.request]\nfrequency_penalty = 0.5\n",
     "serving_tree[0] (id 't'): request: penalties read the tokens on a node's path"),
    ("serving tree request field", '[[serving_tree]]\nid = "t"\nshape = "chain"\n'
     "request = { top_q = 0.5 }\n", "serving_tree[0] (id 't'): request.top_q: unknown field"),
    ("serving tree companion", '[[serving_tree]]\nid = "t"\nshape = "chain"\n'
     "companions = [{ top_p = 2.0 }]\n",
     "serving_tree[0] (id 't'): companions[0].top_p: top_p=2.0 must be <= 1.0"),
    ("serving tree rows", '[[serving_tree]]\nid = "t"\nshape = "chain"\nvocab_size = 8\n'
     "rows = 9\n", "serving_tree[0] (id 't'): rows: must be in [1, 8], got 9"),
    ("not TOML", "[[chain]\n", "not valid TOML"),
    ("unknown table", '[[greedy]]\nid = "g"\n', "greedy: unknown table"),
]


@pytest.mark.parametrize(("kind", "text", "message"), BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_bad_case_file_exits_2_naming_the_file_table_and_field(
    tmp_path: Path, kind: str, text: str, message: str
) -> None:
    """Each kind of bad file is refused before any sampling, exit 2, under ``--case-file``,
    the message naming the file, the table and the field."""
    path = tmp_path / "bad.toml"
    path.write_text(text)
    try:
        read_case_file(path)
    except CaseFileError as error:
        assert message in str(error), (kind, str(error))
    else:
        pytest.fail(f"{kind}: read without an error")
    result = CliRunner().invoke(
        main, ["audit", "tests.wrong_verifiers:residual_is_target", "--case-file", str(path)],
        terminal_width=400,
    )
    assert result.exit_code == 2, result.output
    assert "--case-file" in result.output and str(path) in " ".join(result.output.split())


def test_a_file_id_naming_a_battery_case_exits_2(tmp_path: Path) -> None:
    """An id that is already a battery case (``--case`` could not tell them apart) is refused
    when the run is planned, exit 2, naming the table and ``id``."""
    path = tmp_path / "clash.toml"
    path.write_text('[[chain]]\nid = "v8-far"\n')
    result = CliRunner().invoke(
        main, ["plan", "--in-process", "losslessness.reference:verify", "--case-file", str(path)],
        terminal_width=400,
    )
    assert result.exit_code == 2, result.output
    assert "chain[0] (id 'v8-far'): id:" in " ".join(result.output.split())


@pytest.mark.parametrize(
    ("args", "flag", "field"),
    [
        (["--dtype", "bfloat16", "--tree", "losslessness.reference.tree:verify_tree"],
         "--dtype", "dtype:"),
        (["--case", "no-such-case", "losslessness.reference:verify"], "--case", "cases:"),
    ],
)
def test_planning_errors_name_the_flag_the_user_typed(
    args: list[str], flag: str, field: str
) -> None:
    """An invalid condition found while planning (bfloat16 with a tree target, an unknown
    case id) exits 2 naming the flag (``--dtype``, ``--case``), not the config field."""
    result = CliRunner().invoke(main, ["audit", "--no-progress", "--in-process", *args],
                                terminal_width=400)
    assert result.exit_code == 2, result.output
    assert f"Invalid value for {flag}" in result.output
    assert f"Error: {field}" not in result.output


def _toml_value(value: object) -> str:
    """A Request field's value as TOML (ids and penalties, floats as repr: valid TOML)."""
    if isinstance(value, tuple) and value and isinstance(value[0], tuple):
        return "{ " + ", ".join(f'"{token}" = {bias!r}' for token, bias in value) + " }"
    if isinstance(value, tuple):
        return "[" + ", ".join(str(token) for token in value) + "]"
    return repr(value)


@settings(deadline=None, max_examples=25)
@given(request=requests(12))
def test_any_request_written_as_a_serving_row_reads_back_equal(
    request: Request, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Every request the project's strategy draws, written field by field as a
    ``[[serving.rows]]`` table, reads back as the same :class:`Request`."""
    default = Request()
    lines = ['[[serving]]', 'id = "s"', "vocab_size = 12", "[[serving.rows]]"]
    for name in Request.__dataclass_fields__:
        value = getattr(request, name)
        if value != getattr(default, name) and value is not None:
            lines.append(f"{name} = {_toml_value(value)}")
    path = tmp_path_factory.mktemp("rows") / "cases.toml"
    path.write_text("\n".join(lines) + "\n")
    assert read_case_file(path).serving[0].rows[0].request == request


@settings(deadline=None, max_examples=20)
@given(
    vocab=st.integers(2, 40),
    k=st.integers(1, 4),
    regime=st.sampled_from(sorted(CHAIN_REGIMES)),
    rows=st.integers(1, 3),
    dtype=st.sampled_from(["float64", "float32"]),
    seed=st.integers(0, 2**31),
)
def test_any_valid_chain_table_builds_a_case_of_its_shape(
    vocab: int, k: int, regime: str, rows: int, dtype: str, seed: int,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A chain table of any regime, V, k, row types, dtype and seed builds a case of exactly
    that shape, dtype and regime (the builders' output passes :class:`ChainCase`'s checks)."""
    path = tmp_path_factory.mktemp("chain") / "cases.toml"
    path.write_text(
        f'[[chain]]\nid = "c"\nvocab_size = {vocab}\nk = {k}\nregime = "{regime}"\n'
        f'rows = {rows}\ndtype = "{dtype}"\nseed = {seed}\n'
    )
    [case] = read_case_file(path).chain_cases()
    assert (case.n_rows, case.k, case.vocab_size, case.dtype) == (rows, k, vocab, dtype)
    assert {"case-file", regime} <= case.tags
