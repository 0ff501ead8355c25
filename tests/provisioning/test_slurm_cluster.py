"""The Slurm test cluster itself (devcluster/slurm_cluster.py): the other Slurm tests stand on it."""

import httpx

from devcluster.slurm_cluster import REST_API


def test_three_idle_nodes_with_gpu_gres(slurm):
    output = slurm.run("sinfo", "--noheader", "--Node", "--format=%N %T %G %c %m").stdout

    rows = sorted(line.split() for line in output.splitlines())
    assert rows == [[node, "idle", "gpu:a100:2", "32", "262144"] for node in slurm.node_names]


def test_rest_api_answers_with_the_jwt(slurm):
    response = httpx.get(f"{slurm.rest_url}{REST_API}/nodes", headers=slurm.rest_headers, timeout=10)

    assert response.status_code == 200, response.text
    body = response.json()
    assert body["errors"] == []
    assert {node["name"]: node["gres"] for node in body["nodes"]} == dict.fromkeys(slurm.node_names, "gpu:a100:2")


def test_rest_api_refuses_a_wrong_token(slurm):
    headers = {**slurm.rest_headers, "X-SLURM-USER-TOKEN": slurm.token[:-4] + "AAAA"}

    response = httpx.get(f"{slurm.rest_url}{REST_API}/nodes", headers=headers, timeout=10)

    # Slurm 22.05 answers a bad token with 500 and an "Unspecified error", not 401: the client must not rely on 401.
    assert response.status_code == 500
    assert response.json()["nodes"] == []
    assert response.json()["errors"]


def test_a_drained_node_shows_its_reason_and_resumes(slurm):
    node = slurm.node_names[0]

    slurm.scontrol("update", f"nodename={node}", "state=drain", "reason=smoke test")
    assert slurm.node_states()[node] == "drained"
    assert slurm.node_reason(node) == "smoke test"

    slurm.resume_all()
    slurm.wait_for_node_state(node, "idle")
