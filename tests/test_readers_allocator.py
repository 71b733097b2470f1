"""Tests of readers.use_pooled_host_memory: TensorFlow's host memory from a pool, when asked.

Which allocator TensorFlow picks by itself depends on the CPU and the build:
TF 2.21 pools host memory already where its oneDNN path is on (the default on
CPUs with AVX-512, `TF_ENABLE_ONEDNN_OPTS=1`) and uses `malloc` where it is
off. The tests do not assume either: they measure TensorFlow's own choice in
a control process in the same run and compare with it. Each process is a
child forked from one interpreter that has imported TensorFlow and run no op
(`helpers.forked_programs`): TensorFlow picks its allocator at its first op,
so each child chooses afresh, for one TensorFlow import instead of one per
process.
"""

import os

import pytest

from helpers import forked_programs

from readers import _allocator

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Prints which allocator TensorFlow's CPU device uses (only a pooling one
# keeps statistics), then the variable as the process ended with it.
_WHICH = (
    "import tensorflow as tf\n"
    "tf.zeros([256, 256]).numpy()\n"
    "try:\n"
    "    tf.config.experimental.get_memory_info('CPU:0')\n"
    "    print('pool')\n"
    "except ValueError:\n"
    "    print('malloc')\n"
    "import os\n"
    "print(os.environ.get('TF_CPU_ALLOCATOR_USE_BFC'))\n"
)


# Every process of this file: (code, allocator variables). Each test reads its
# own; the controls are TensorFlow alone, without and with the user's setting.
_CALL = "import readers\nprint(readers.use_pooled_host_memory())\n" + _WHICH
_INTERPRETERS = {
    "control": (_WHICH, {}),
    "control-bfc-false": (_WHICH, {_allocator.USE_BFC: "false"}),
    "the-call": ("import readers\nreaders.use_pooled_host_memory()\n" + _WHICH, {}),
    "import": ("import readers\n" + _WHICH, {}),
    "users-setting": (_CALL, {_allocator.USE_BFC: "false"}),
    "too-late": ("import logging\n"
                 "logging.basicConfig(level=logging.INFO)\n"
                 "import tensorflow as tf\n"
                 "tf.ones([2]).numpy()\n" + _CALL, {}),
    "started": ("from readers import _allocator\n"
                "print(_allocator._tensorflow_started())\n"
                "import tensorflow as tf\n"
                "tf.zeros([1]).numpy()\n"
                "print(_allocator._tensorflow_started())\n", {}),
}


@pytest.fixture(scope="module")
def fresh():
    """`fresh(name)`: (stdout lines, stderr) of that process of `_INTERPRETERS`.

    All of them forked one after the other from one interpreter that imported TensorFlow;
    a failed one fails only the tests that read it.
    """
    env = {k: v for k, v in os.environ.items()
           if k not in (_allocator.USE_BFC, _allocator.MEM_LIMIT_MB)}
    children = forked_programs("import tensorflow\n", _INTERPRETERS, cwd=_REPO, env=env)

    def read(name):
        status, out, err = children[name]
        assert status == 0, err[-3000:]
        return out.split("\n"), err

    return read


def _tensorflows_own_choice(fresh, name: str = "control") -> str:
    """The control: 'pool' or 'malloc', as TensorFlow alone picks on this machine and build."""
    lines, _ = fresh(name)
    assert lines[0] in ("pool", "malloc")
    assert lines[1] == _INTERPRETERS[name][1].get(_allocator.USE_BFC, "None")
    return lines[0]


def test_the_call_gives_tensorflow_the_pool(fresh):
    lines, _ = fresh("the-call")
    # 'pool' whatever TensorFlow's own choice; the variable says it came from the call.
    assert lines[:2] == ["pool", "true"]


def test_importing_readers_changes_no_allocator(fresh):
    lines, _ = fresh("import")
    assert lines[:2] == [_tensorflows_own_choice(fresh), "None"]


def test_the_users_setting_stands(fresh):
    lines, _ = fresh("users-setting")
    assert lines[:3] == ["False", _tensorflows_own_choice(fresh, "control-bfc-false"), "false"]


def test_too_late_is_left_alone_and_said(fresh):
    lines, stderr = fresh("too-late")
    assert lines[:3] == ["False", _tensorflows_own_choice(fresh), "None"]
    assert "TF_CPU_ALLOCATOR_USE_BFC=true before TensorFlow starts" in stderr


@pytest.mark.parametrize("physical_mb, expected", [
    (200_000, "200000"),  # more than TensorFlow's 64 GiB ceiling: raised
    (16_000, None),  # less: TensorFlow's default stands
    (None, None),  # unknown
])
def test_pool_ceiling_follows_the_machine(monkeypatch, physical_mb, expected):
    monkeypatch.delenv(_allocator.USE_BFC, raising=False)
    monkeypatch.delenv(_allocator.MEM_LIMIT_MB, raising=False)
    monkeypatch.setattr(_allocator, "_tensorflow_started", lambda: False)
    monkeypatch.setattr(_allocator, "_physical_memory_mb", lambda: physical_mb)
    assert _allocator.use_pooled_host_memory() is True
    assert os.environ[_allocator.USE_BFC] == "true"
    assert os.environ.get(_allocator.MEM_LIMIT_MB) == expected


def test_a_users_ceiling_stands(monkeypatch):
    monkeypatch.delenv(_allocator.USE_BFC, raising=False)
    monkeypatch.setenv(_allocator.MEM_LIMIT_MB, "1024")
    monkeypatch.setattr(_allocator, "_tensorflow_started", lambda: False)
    monkeypatch.setattr(_allocator, "_physical_memory_mb", lambda: 500_000)
    assert _allocator.use_pooled_host_memory() is True
    assert os.environ[_allocator.MEM_LIMIT_MB] == "1024"


def test_started_tensorflow_is_seen(fresh):
    lines, _ = fresh("started")
    assert lines[:2] == ["False", "True"]
