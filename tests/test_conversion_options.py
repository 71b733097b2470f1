"""conversion.options: sharding and writing options check themselves, naming their flag; --split parses."""

from __future__ import annotations

import pytest

from conversion.options import ShardingOptions, WritingOptions, parse_split


def test_sharding_defaults_and_the_manifest_policy():
    assert ShardingOptions().target_shard_bytes == 128 << 20
    assert ShardingOptions().to_json() == {"target_shard_mb": 128, "min_shards": 8}
    assert ShardingOptions(num_shards=3).to_json() == {"num_shards": 3}


@pytest.mark.parametrize("field, flag", [("num_shards", "--num_shards"), ("target_shard_mb", "--target_shard_mb"),
                                         ("min_shards", "--min_shards")])
def test_sharding_refuses_fewer_than_one(field, flag):
    with pytest.raises(ValueError, match=f"^{flag} must be at least 1. Received: 0$"):
        ShardingOptions(**{field: 0})


@pytest.mark.parametrize("kwargs, message", [
    ({"file_timeout": 0}, "--file_timeout must be a number of seconds above 0. Received: 0"),
    ({"file_timeout": True}, "--file_timeout must be a number of seconds above 0. Received: True"),
    ({"file_timeout": "5"}, "--file_timeout must be a number of seconds above 0. Received: '5'"),
    ({"worker_threads": 0}, "--worker_threads must be at least 1. Received: 0"),
    ({"worker_processes": -1}, "--worker_processes must be 0 (the runner's own threads) or more processes. Received: -1"),
    ({"worker_processes": 1.5}, "--worker_processes must be 0 (the runner's own threads) or more processes. Received: 1.5"),
])
def test_writing_refuses_a_bad_value_naming_the_flag(kwargs, message):
    with pytest.raises(ValueError) as info:
        WritingOptions(**kwargs)
    assert str(info.value) == message


def test_writing_takes_its_defaults_and_good_values():
    assert WritingOptions() == WritingOptions(dedup=False, resume=False, worker_threads=None,
                                              worker_processes=None, file_timeout=600.0, isolated=False)
    assert WritingOptions(worker_processes=0, file_timeout=1, worker_threads=2).worker_processes == 0


def test_split_ratios_and_aliases():
    assert parse_split("train=0.8,validation=0.1,test=0.1") == {"train": 0.8, "validation": 0.1, "test": 0.1}
    assert parse_split(" Train = 0.5 , val=0.5") == {"train": 0.5, "validation": 0.5}
    assert parse_split("train=1") == {"train": 1.0}


@pytest.mark.parametrize("text", ["train", "train=x", "train=1.5", "tr ain=1", "train=0.5,train=0.5", "=1"])
def test_a_malformed_split_is_one_sentence_with_an_example(text):
    with pytest.raises(ValueError, match=r"--split must look like train=0.8,validation=0.1,test=0.1 .*Received"):
        parse_split(text)


def test_ratios_must_add_up_to_one():
    with pytest.raises(ValueError, match=r"--split ratios must add up to 1. Received: 'train=0.5,test=0.4' \(sum 0.9\)"):
        parse_split("train=0.5,test=0.4")


@pytest.mark.parametrize("text, name, meant", [
    ("train=0.8,valdation=0.2", "valdation", "validation"),
    ("trian=0.8,val=0.2", "trian", "train"),
    ("trainig=0.9,test=0.1", "trainig", "training"),
])
def test_a_misspelt_split_name_is_refused_naming_the_split_it_looks_like(text, name, meant):
    # A split of any name is allowed, so a typo would become a split no trainer reads.
    with pytest.raises(ValueError, match=rf"--split: '{name}' looks like a misspelling of '{meant}'.*"
                                          rf"Received: '{text}'"):
        parse_split(text)


def test_other_split_names_are_kept_as_written():
    assert parse_split("train=0.7,eval=0.1,holdout=0.1,test_2=0.1") == {
        "train": 0.7, "eval": 0.1, "holdout": 0.1, "test_2": 0.1}
    assert parse_split("train=0.8,tests=0.1,dev=0.1") == {"train": 0.8, "tests": 0.1, "dev": 0.1}
