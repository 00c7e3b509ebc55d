"""The `teams:` section: one implicit team when absent; each bad value one line naming the field."""

from __future__ import annotations

import copy

import pytest

from config.settings.teams import PRIORITIES, team_namespace
from tests.test_settings import dev_data, error_of, parse

RESEARCH = "arn:aws:iam::111122223333:role/Research"
APPLIED = "arn:aws:iam::111122223333:role/Applied"


def with_teams(teams: dict, **sections: dict) -> dict:
    data = dev_data()
    data["cluster"].pop("job_submitter_principals", None)
    data.pop("teams", None)
    data["teams"] = teams
    for section, values in sections.items():
        data[section] = {**data.get(section, {}), **values}
    return data


def two_teams() -> dict:
    return {
        "research": {"submitters": [RESEARCH], "gpu_nodes": 1},
        "applied": {"submitters": [APPLIED], "gpu_nodes": 1, "borrowing_limit_nodes": 1,
                    "default_priority": "low"},
    }  # fmt: skip


def one_line_error(data: dict) -> str:
    message = error_of(data)
    assert len(message.strip().splitlines()) == 1, message
    return message


def without_teams() -> dict:
    data = dev_data()
    data["cluster"]["job_submitter_principals"] = [
        a for t in data.pop("teams").values() for a in t["submitters"]
    ]
    return data


def test_no_section_is_one_implicit_team_with_todays_meaning():
    data = without_teams()
    settings = parse(data)
    (team,) = settings.team_list
    assert team.implicit and team.name == "default"
    assert team.namespace == settings.workload.namespace
    assert team.submitters == tuple(data["cluster"].get("job_submitter_principals", []))
    assert team.gpu_nodes == settings.gpu_nodes.max_size
    assert team.borrowing_limit_nodes is None and team.lending_limit_nodes is None
    assert team.submitter_group == "ray-train:job-submitters"


def test_teams_in_file_order_each_with_its_namespace_and_group():
    settings = parse(with_teams(two_teams()))
    assert [t.name for t in settings.team_list] == ["research", "applied"]
    assert settings.deploy_team.name == "research"
    applied = settings.team("applied")
    assert applied is not None
    assert applied.namespace == team_namespace("applied") == "ray-applied"
    assert applied.default_priority == "low"
    assert applied.submitter_group == "ray-train:applied:job-submitters"
    assert applied.most_nodes(settings.gpu_nodes.max_size) == 2
    assert settings.team("research").most_nodes(2) == 2  # borrowing unset: whatever is idle
    assert settings.team("nobody") is None


def _set(path: tuple, value):
    def mutate(d: dict) -> None:
        target = d
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return mutate


@pytest.mark.parametrize(
    ("mutate", "field", "says"),
    [
        (_set(("teams", "research", "submitters"), []), "teams.research.submitters", "at least 1"),
        (_set(("teams", "research", "submitters"), ["Research"]), "teams.research.submitters", "IAM role"),
        (_set(("teams", "applied", "submitters"), [RESEARCH]), "teams.applied.submitters", "'research'"),
        (_set(("teams", "research", "submitters"), ["arn:aws:iam::111122223333:role/Admin"]),
         "teams.research.submitters", "admin_principal_arns"),
        (_set(("teams", "applied", "default_priority"), "urgent"), "teams.applied.default_priority",
         "low, normal, high"),
        (_set(("teams", "research", "gpu_nodes"), 2), "teams:", "add up to 3"),
        (_set(("teams", "research", "gpu_nodes"), -1), "teams.research.gpu_nodes", "greater than or equal"),
        (_set(("teams", "research", "lending_limit_nodes"), 2), "teams.research.lending_limit_nodes",
         "at most 1"),
        (_set(("teams", "applied", "borrowing_limit_nodes"), 2), "teams.applied.borrowing_limit_nodes",
         "set at most 1"),
        (_set(("teams", "Research!"), {"submitters": [RESEARCH], "gpu_nodes": 0}), "teams",
         "cannot name a team"),
        (_set(("teams", "research", "quota"), 1), "teams.research.quota", "unknown field"),
        (_set(("cluster", "job_submitter_principals"), ["arn:aws:iam::111122223333:role/Other"]),
         "cluster.job_submitter_principals", "teams.<name>.submitters"),
    ],
)  # fmt: skip
def test_each_bad_value_is_one_line_naming_the_field(mutate, field, says):
    data = with_teams(two_teams())
    mutate(data)
    message = one_line_error(data)
    assert f": {field}" in message or f" {field}" in message, message
    assert says in message, message


def test_a_standing_cluster_is_refused_beside_teams():
    data = with_teams(two_teams(), job={"cluster": "standing", "ttl_seconds_after_finished": 0})
    message = one_line_error(data)
    assert "job.cluster" in message and "clusterSelector" in message


def test_a_team_that_could_never_run_is_refused():
    teams = two_teams()
    teams["applied"].update(gpu_nodes=0, borrowing_limit_nodes=0)
    message = one_line_error(with_teams(teams))
    assert "teams.applied.gpu_nodes" in message and "never run" in message


def test_the_deployed_job_must_fit_what_the_first_team_can_be_given():
    teams = two_teams()
    teams["research"]["borrowing_limit_nodes"] = 0
    message = one_line_error(with_teams(teams, job={"deploy": True, "nodes": 2}))
    assert "job.nodes" in message and "research" in message and "at most 1" in message
    # Not deployed: a bigger job is `raytrain job submit`'s to refuse, per team.
    parse(with_teams(teams, job={"deploy": False, "nodes": 2}))


def test_quotas_may_sum_to_the_node_group_and_borrowing_goes_beyond():
    teams = copy.deepcopy(two_teams())
    settings = parse(with_teams(teams))
    assert sum(t.gpu_nodes for t in settings.team_list) == settings.gpu_nodes.max_size


def test_priorities_are_ordered_lowest_first():
    assert list(PRIORITIES) == sorted(PRIORITIES, key=PRIORITIES.__getitem__)
