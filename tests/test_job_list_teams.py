"""`raytrain job list --all-teams`: every team's RayJobs in one table, for a caller whose RBAC lets
it list RayJobs in every team namespace (a cluster admin); a team's submitter is refused up front,
naming the namespace. The fake API server answers SelfSubjectAccessReviews by evaluating the
Workload chart's own Roles and RoleBindings (tests/test_submitter_rbac.py) for the caller's groups."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
from rich.console import Console

from config.loader import load_settings
from raytrain import cli
from tests.test_job import ENV, FakeApi, _Handler, cluster_routes
from tests.test_submitter_rbac import Attributes, _objects, allowed

REVIEWS = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
ADMIN = "system:masters"  # what EKS's AmazonEKSClusterAdminPolicy maps an admin's entry to


def rbac_allows(env: str, groups: set[str], a: Attributes) -> bool:
    """RBAC for a caller in `groups`: an admin may do anything; otherwise a RoleBinding in the
    namespace must name one of the groups and its Role allow the request."""
    if ADMIN in groups:
        return True
    objects = [o for o in _objects(env) if o["metadata"].get("namespace") == a.namespace]
    roles = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Role"}
    for binding in (o for o in objects if o["kind"] == "RoleBinding"):
        if any(s["kind"] == "Group" and s["name"] in groups for s in binding["subjects"]):
            role = roles.get(binding["roleRef"]["name"])
            if role is not None and allowed(role["rules"], a):
                return True
    return False


class _ReviewingHandler(_Handler):
    server: ReviewingApi

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path.split("?")[0] != REVIEWS:
            self._json(404, {"kind": "Status", "code": 404})
            return
        attrs = body["spec"]["resourceAttributes"]
        a = Attributes(attrs["verb"], attrs.get("group", ""), attrs["resource"], "", attrs["namespace"], "")
        self.server.reviews.append(a)
        body["status"] = {"allowed": rbac_allows(ENV, self.server.groups, a)}
        self._json(201, body)


class ReviewingApi(FakeApi):
    def __init__(self, groups: set[str]) -> None:
        super().__init__()
        self.RequestHandlerClass = _ReviewingHandler
        self.groups = groups
        self.reviews: list[Attributes] = []


def routes_for_every_team() -> dict[str, Any]:
    """Each team namespace with the fake cluster's RayJobs, renamed after the team."""
    settings = load_settings(ENV)
    routes: dict[str, Any] = {}
    for team in settings.team_list:
        team_routes = copy.deepcopy(cluster_routes(settings.for_team(team.name)))
        jobs = team_routes[f"/apis/ray.io/v1/namespaces/{team.namespace}/rayjobs"]
        for job in jobs["items"]:
            job["metadata"]["name"] = f"{team.name}-{job['metadata']['name']}"
        routes.update(team_routes)
    return routes


def run_list(server: FakeApi, *argv: str) -> tuple[int, str]:
    args = cli.build_parser().parse_args(
        ["job", "list", *argv, "--env", ENV, "--kubeconfig", str(server.kubeconfig)]
    )
    console = Console(record=True, width=250, force_terminal=False)
    rc = args.func(args, console=console)
    return rc, console.export_text()


@pytest.fixture
def serve(serve_kube_api: Callable[[FakeApi], FakeApi]) -> Callable[[set[str]], ReviewingApi]:
    def start(groups: set[str]) -> ReviewingApi:
        api = serve_kube_api(ReviewingApi(groups))
        api.routes = routes_for_every_team()
        return api  # type: ignore[return-value]

    return start


def test_an_admin_lists_every_teams_jobs_in_one_table(serve: Callable[[set[str]], ReviewingApi]) -> None:
    api = serve({ADMIN})
    rc, text = run_list(api, "--all-teams")
    assert rc == 0, text
    teams = load_settings(ENV).team_list
    assert len(teams) >= 2
    for team in teams:
        assert team.namespace in text  # the title names every namespace listed
        assert f"{team.name}-" in text  # its jobs, in the team column and their names
    assert {a.namespace for a in api.reviews} == {t.namespace for t in teams}
    assert all((a.verb, a.api_group, a.resource) == ("list", "ray.io", "rayjobs") for a in api.reviews)


def test_a_teams_submitter_is_refused_naming_the_namespace_it_may_not_list(
    serve: Callable[[set[str]], ReviewingApi],
) -> None:
    research, applied = load_settings(ENV).team_list
    api = serve({research.submitter_group})
    rc, text = run_list(api, "--all-teams")
    assert rc == 2, text
    assert len(text.strip().splitlines()) == 1, text
    assert f"may not list RayJobs in {applied.namespace} (team {applied.name})" in text
    assert "cluster.admin_principal_arns" in text and "--team" in text
    # Nothing listed first: the refusal comes before any RayJob is read.
    assert not [p for p in api.requests if "/rayjobs" in p]
    # Its own team's list needs no review and works as before.
    rc, text = run_list(api, "--team", research.name)
    assert rc == 0 and f"{research.name}-" in text and f"{applied.name}-" not in text, text


def test_without_all_teams_several_teams_still_need_team(serve: Callable[[set[str]], ReviewingApi]) -> None:
    rc, text = run_list(serve({ADMIN}))
    assert rc == 2 and "--team" in text, text
