"""kvbench.models.kvpress_oracle without kvpress: how a head's kept positions are judged, ties and disagreements
told apart by kvpress's scores, and the peer's file read. The run against kvpress itself: tests/test_kvpress_peer.py."""

from __future__ import annotations

import json

import pytest
import torch

from kvbench.models import kvpress_oracle as oracle


def test_identical_positions_are_identical():
    head = oracle.judge_head(0, 1, [0, 3, 5], [0, 3, 5])
    assert head.identical and not head.tie and head.reason is None


def test_a_swap_at_a_cut_closer_than_the_epsilon_is_a_tie_with_its_gap():
    scores = torch.tensor([5.0, 1.0, 2.0 + 1e-7, 2.0, 4.0], dtype=torch.float64)  # kvpress keeps 0, 4, 2 (2 beats 3 by 5e-8 relative)
    head = oracle.judge_head(3, 2, [0, 3, 4], [0, 2, 4], scores)
    assert not head.identical and head.tie and head.reason is None
    assert head.ours_only == (3,) and head.theirs_only == (2,)
    assert head.gap == pytest.approx(1e-7 / 2.0, rel=0.1)


def test_a_swap_farther_from_the_cut_than_the_epsilon_is_a_disagreement_naming_the_gap():
    scores = torch.tensor([5.0, 1.0, 2.5, 2.0, 4.0])  # position 3 is 20% below the cut
    head = oracle.judge_head(0, 0, [0, 3, 4], [0, 2, 4], scores)
    assert not head.identical and not head.tie
    assert "0.2 (relative) from kvpress's cut 2.5" in head.reason and "epsilon 1e-05" in head.reason


def test_the_epsilon_is_the_callers_to_state():
    scores = torch.tensor([5.0, 1.0, 2.5, 2.0, 4.0])
    assert oracle.judge_head(0, 0, [0, 3, 4], [0, 2, 4], scores, epsilon=0.25).tie


def test_a_different_count_is_a_disagreement_whatever_the_scores():
    head = oracle.judge_head(0, 0, [0, 1], [0, 1, 2], torch.zeros(3))
    assert not head.tie and head.reason == "kvbench keeps 2 positions, kvpress 3"


def test_differing_positions_without_scores_are_never_called_a_tie():
    head = oracle.judge_head(0, 0, [0, 1], [0, 2])
    assert not head.tie and "no kvpress scores" in head.reason


def peer_run(kept, method="knorm", ratio=0.5):
    return {"method": method, "ratio": ratio, "options": {"compression_ratio": ratio}, "n_kept": [len(kept[0][0])],
            "kept": kept, "next_token": {"top5": [[2, 3.0]]}}


def test_a_run_is_compared_head_by_head_and_its_logits_held_only_when_the_caches_agree():
    logits = torch.tensor([0.0, 1.0, 3.0, 2.0, -1.0, 0.5])
    tensors = {"knorm@0.5": {"logits": logits + 5e-5, "scores": torch.tensor([[[3.0, 1.0, 2.0], [1.0, 2.0, 3.0]]])}}
    same = oracle.compare_run(peer_run([[[0, 2], [1, 2]]]), [[[0, 2], [1, 2]]], logits, tensors)
    assert same.identical == 2 and same.ties == [] and same.disagreements == []
    assert same.max_logit_difference == pytest.approx(5e-5, rel=1e-2) and same.logits_hold() is True
    assert same.top5_ours[0] == [2, 3.0] and same.top5_theirs == [[2, 3.0]]
    differ = oracle.compare_run(peer_run([[[0, 2], [1, 2]]]), [[[0, 1], [1, 2]]], logits, tensors)
    assert differ.identical == 1 and len(differ.disagreements) == 1 and differ.logits_hold() is None
    summary = differ.summary()
    assert summary["disagreements"][0]["ours_only"] == (1,) and json.dumps(summary)


def test_a_run_of_another_depth_is_refused():
    with pytest.raises(ValueError, match="the peer has 2 layers, kvbench's model 1"):
        oracle.compare_run(peer_run([[[0]], [[0]]]), [[[0]]], torch.zeros(3))


def test_a_method_kvbench_lacks_is_named_as_unavailable():
    assert "no mode 'no-such-press' registered" in oracle.unavailable("no-such-press")
    assert "does not evict" in oracle.unavailable("static")
    with pytest.raises(ValueError, match="no mode 'no-such-press'"):
        oracle.kvbench_run(None, None, "no-such-press", 0.5)


def test_the_peer_file_is_refused_for_another_schema_or_a_missing_field(tmp_path):
    path = tmp_path / "peer.json"
    path.write_text(json.dumps({"schema": "something/1"}))
    with pytest.raises(ValueError, match="expected a kvpress peer output of schema kvbench.kvpress-peer/1, got "
                                         "'something/1'"):
        oracle.read_peer(path)
    path.write_text(json.dumps({"schema": oracle.PEER_SCHEMA, "model": {}, "prompt": {}, "runs": [{"method": "x"}]}))
    with pytest.raises(ValueError, match=r"runs\[0\] lacks \['ratio', 'options', 'n_kept', 'kept'\]"):
        oracle.read_peer(path)


def test_another_model_file_is_refused_by_its_hash():
    with pytest.raises(ValueError, match="sha256 aaa, kvbench's model is of bbb"):
        oracle.check_same_model({"model": {"sha256": "aaa"}}, "bbb")
