"""A stop request recorded from a real signal, the launcher checks, and the count of ddp_spawn
workers that reached training (what the launcher reads when it is signalled)."""

import multiprocessing
import os
import signal

import pytest

from rl_gap.training import stop_request as sr


@pytest.fixture
def clean_state():
    previous = signal.getsignal(signal.SIGTERM)
    sr.clear_stop_request()
    saved = dict(sr._training_started)
    yield
    signal.signal(signal.SIGTERM, previous)
    sr.clear_stop_request()
    sr._training_started.update(saved)


def test_a_real_sigterm_is_recorded_not_fatal_and_the_first_signal_wins(clean_state):
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    sr.listen_for_sigterm()
    os.kill(os.getpid(), signal.SIGTERM)  # would end pytest without the handler
    assert sr.stop_requested() == signal.SIGTERM
    sr.request_stop(signal.SIGINT)
    assert sr.stop_requested() == signal.SIGTERM
    sr.clear_stop_request()
    assert sr.stop_requested() is None


def test_listen_for_sigterm_keeps_a_handler_already_installed(clean_state):
    def mine(signum, frame):
        pass

    signal.signal(signal.SIGTERM, mine)
    sr.listen_for_sigterm()
    assert signal.getsignal(signal.SIGTERM) is mine


@pytest.mark.parametrize(
    "env, launched",
    [({}, False), ({sr.LAUNCHER_PID_ENV: "1"}, True), ({sr.LAUNCHER_PID_ENV: "self"}, False)],
)
def test_only_a_process_started_by_the_launcher_is_a_launched_rank(env, launched):
    env = {k: str(os.getpid()) if v == "self" else v for k, v in env.items()}
    assert sr.is_launched_rank(env) is launched


def test_each_spawned_worker_counts_itself_once_when_training_starts(clean_state):
    counter = multiprocessing.get_context("spawn").Value("i", 0)

    def training(twice):
        for _ in range(2 if twice else 1):
            sr.note_training_started()
        return "trained"

    assert sr.run_spawned_rank(counter, training, True) == "trained"
    assert counter.value == 1  # a second call in the same worker is not a second worker
    sr.run_spawned_rank(counter, training, False)  # another worker (a fresh registration)
    assert counter.value == 2
    sr._training_started.update(counter=None, counted=False)
    sr.note_training_started()  # outside a ddp_spawn worker: no count, no error
    assert counter.value == 2
