"""One clear line for the settings mistakes people make: numbers YAML reads from unquoted values,
misspelt fields, a missing config directory, two environments naming one cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from config.loader import SettingsError, environments_dir, load_settings, parse_settings

DEV = (environments_dir() / "dev.yaml").read_text()


def problem(text: str) -> str:
    with pytest.raises(SettingsError) as info:
        parse_settings(text, name="dev", source="dev.yaml")
    (line,) = str(info.value).splitlines()  # one problem, one line
    assert line.startswith("dev.yaml: ")
    return line.removeprefix("dev.yaml: ")


def test_unquoted_kubernetes_version_says_quote_it_and_what_is_valid():
    line = problem(DEV.replace('kubernetes_version: "1.35"', "kubernetes_version: 1.30"))
    assert line.startswith("cluster.kubernetes_version: YAML read this unquoted value as the number 1.3;")
    assert 'quote it, e.g. kubernetes_version: "1.36" (valid: 1.34, 1.35, 1.36)' in line


def test_unquoted_account_says_quote_it():
    line = problem(DEV.replace('account: "111122223333"', "account: 111122223333"))
    assert line.startswith("account: YAML read this unquoted value as the number 111122223333;")
    assert 'account: "111122223333"' in line


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (
            "  nat_gateways: 1",
            "  nat_gateway: 1",
            "vpc.nat_gateway: unknown field; did you mean 'nat_gateways'?",
        ),
        ("  min_size: 0", "  min_siz: 0", "gpu_nodes.min_siz: unknown field; did you mean 'min_size'?"),
        ("storage:\n", "storag:\n", "storag: unknown field; did you mean 'storage'?"),
    ],
)
def test_misspelt_field_gets_did_you_mean(old, new, expected):
    assert problem(DEV.replace(old, new, 1)).startswith(expected)


def test_unknown_field_without_a_close_match_names_the_reference():
    line = problem(DEV + "xyzzy: 1\n")
    assert line == "xyzzy: unknown field (fields: config/environments/example.yaml)"


def test_missing_config_dir_says_no_such_directory(tmp_path):
    with pytest.raises(SettingsError, match=r"^.*/missing: no such directory of environment files$"):
        load_settings("dev", tmp_path / "missing")


def _environments(tmp_path: Path, **files: str) -> Path:
    for name, text in files.items():
        (tmp_path / f"{name}.yaml").write_text(text)
    return tmp_path


def test_two_environments_with_one_cluster_in_one_account_and_region_are_refused(tmp_path):
    directory = _environments(tmp_path, dev=DEV, staging=DEV.replace("run_name: dev-smoke", "run_name: st"))
    with pytest.raises(SettingsError) as info:
        load_settings("staging", directory)
    message = str(info.value)
    assert "\n" not in message
    assert "staging.yaml: cluster.name: 'ray-train-dev' is also env='dev''s cluster" in message
    assert "account 111122223333 us-west-2" in message


def test_the_same_cluster_name_in_another_region_or_account_is_fine(tmp_path):
    other_account = DEV.replace('account: "111122223333"', 'account: "444455556666"').replace(
        "arn:aws:iam::111122223333:", "arn:aws:iam::444455556666:"
    )
    directory = _environments(tmp_path, dev=DEV, staging=other_account, broken="account: [\n")
    assert load_settings("staging", directory).cluster.name == "ray-train-dev"


def test_the_shipped_environments_load():
    for name in ("dev", "prod"):
        load_settings(name)
