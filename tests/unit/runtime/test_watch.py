"""The job's lines on what its cluster did (runtime/watch.py): nodes added and removed between two polls, each
pool's largest size against its maximum. The polling itself runs in the autoscaling test
(tests/system/test_autoscaling.py), where an autoscaler adds the nodes and one is lost mid-job."""

from mieb_ray.runtime.watch import Seen, alive_nodes, change_lines, pool_counts


def test_alive_nodes_are_read_from_ray_nodes_records():
    reported = [{"NodeID": "a", "Alive": True, "Resources": {"CPU": 2.0, "GPU": 1.0, "memory": 5.0}},
                {"NodeID": "b", "Alive": False, "Resources": {"CPU": 2.0}},
                {"NodeID": "c", "Alive": True, "Resources": {}}]
    assert alive_nodes(reported) == {"a": {"CPU": 2.0, "GPU": 1.0}, "c": {"CPU": 0.0, "GPU": 0.0}}


def test_a_line_per_node_added_or_removed_with_what_is_up_after():
    head = {"h": {"CPU": 0.0, "GPU": 0.0}}
    gpu = {"g1": {"CPU": 2.0, "GPU": 1.0}}
    cpu = {"c1": {"CPU": 2.0, "GPU": 0.0}}
    assert change_lines("embed", head, head) == []
    assert change_lines("embed", head, head | gpu | cpu) == [
        "[embed] node added (2 CPU): now 3 nodes, 4 CPU, 1 GPU",
        "[embed] node added (2 CPU, 1 GPU): now 3 nodes, 4 CPU, 1 GPU"]
    assert change_lines("build", head | gpu, head) == ["[build] node removed (2 CPU, 1 GPU): now 1 node, 0 CPU, 0 GPU"]
    assert change_lines("build", gpu, head) == ["[build] node added (no CPU): now 1 node, 0 CPU, 0 GPU",
                                                "[build] node removed (2 CPU, 1 GPU): now 1 node, 0 CPU, 0 GPU"]


def test_a_pool_counts_the_actors_that_started_by_the_class_ray_data_names_them_after():
    encoder = "MapWorker(MapBatches(EncodeStage))"
    actors = [{"actor_id": "a", "pid": 11, "class_name": encoder},
              {"actor_id": "b", "pid": 12, "class_name": encoder},  # ended since: it ran
              {"actor_id": "c", "pid": 0, "class_name": encoder},  # still waiting for its node: never ran
              {"actor_id": "a", "pid": 13, "class_name": encoder},  # a restarted on another node: one actor
              {"actor_id": "g", "pid": 0, "num_restarts": 1, "class_name": encoder},  # its node lost, waiting
              {"actor_id": "d", "pid": 14, "class_name": "MapWorker(MapBatches(ShardBuilder))"},
              {"actor_id": "e", "pid": 15, "class_name": "MapWorker(MapBatches(EncodeStageX))"},  # another class
              {"actor_id": "f", "pid": 16, "class_name": None}]
    assert pool_counts(actors, {"encoders": "EncodeStage", "shard builders": "ShardBuilder", "hashers": "Hash"}) == \
        {"encoders": 3, "shard builders": 1, "hashers": 0}


def test_the_summary_names_nodes_added_and_removed_and_each_pools_actors_against_its_maximum():
    seen = Seen(added={"g1", "g2", "c1"}, removed={"g1"}, started={"encoders": 2})
    assert seen.summary("embed", {"encoders": 3}) == \
        "[embed] cluster during the job: 3 nodes added, 1 removed; encoders: 2 of 3 actors started"
    # a pool the state API could not report is left out, not reported as 0
    assert Seen().summary("build", {"shard builders": 1}) == "[build] cluster during the job: no node added or removed"
    assert Seen(added={"c"}, started={"shard builders": 1}).summary("build", {"shard builders": 1}) == \
        "[build] cluster during the job: 1 node added, 0 removed; shard builders: 1 of 1 actor started"
