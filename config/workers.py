"""Clean stops for `manage.py qcluster` (django-q2), installed once at start-up (provisioning's `ready()`).

On SIGTERM django-q2's sentinel lets every worker finish its task and then every task it pulled ahead from the
broker (up to `queue_limit`), however long they take: a provisioning step sleeping through a wait, or the simulated
installer installing, kept a stopping cluster alive for minutes, and pulled tasks stayed locked in the ORM broker for
`retry` seconds. Here a stop instead:
1. hands the tasks pulled but not started back to the broker (ORM: unlocked at once; Redis: pushed back);
2. tells each worker to stop (SIGUSR1): task code that waits uses `wait_unless_stopping` and hands its work back;
3. kills a worker still busy after Q_STOP_GRACE_SECONDS: its step's lease lapses, another worker takes over.
A SIGTERM sent to the whole process group (`make run`'s `kill 0`, systemd's default) used to kill the sentinel
while it slept on the stop event, and the main process then waited for ever to wake it: the sentinel and its
pusher and monitor now ignore SIGTERM (the main process stops them in order), and a worker takes it as the stop.
"""

import contextlib
import logging
import os
import queue
import signal
import threading

from django.conf import settings
from django.utils import timezone

logger = logging.getLogger(__name__)

_stopping = threading.Event()  # set in a worker process when its cluster stops


def wait_unless_stopping(seconds: float) -> bool:
    """Sleep up to `seconds`; True when the worker was told to stop (then hand the work back and return)."""
    return _stopping.wait(seconds)


def stopping() -> bool:
    """True once the worker was told to stop: start nothing new, hand it back."""
    return _stopping.is_set()


def install() -> None:
    # django-q2's cluster and broker modules need the app registry: imported here, from an app's ready().
    from django_q import cluster
    from django_q.signals import post_spawn

    post_spawn.connect(_listen_for_stop, dispatch_uid="config.workers.listen_for_stop")
    if not getattr(cluster.Sentinel.stop, "hands_back", False):
        cluster.Sentinel.stop = _handing_back(cluster.Sentinel.stop)
        cluster.Sentinel.start = _ignoring_sigterm(cluster.Sentinel.start)


def _listen_for_stop(sender, proc_name, **kwargs) -> None:
    """In each new worker process, before its first task. Tasks run synchronously (Q_CLUSTER "sync") send the same
    signal from whatever process and thread calls them: those are no cluster's workers."""
    from django_q.conf import Conf

    if not Conf.SYNC:
        for signum in (signal.SIGUSR1, signal.SIGTERM):
            signal.signal(signum, lambda signum, frame: _stopping.set())


def _ignoring_sigterm(start):
    def start_ignoring_sigterm(sentinel) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # before it spawns the pusher, monitor and workers
        start(sentinel)

    return start_ignoring_sigterm


def _handing_back(stop):
    def stop_handing_back(sentinel) -> None:
        sentinel.event_out.set()  # the pusher pulls nothing more
        while sentinel.pusher.is_alive():  # it may be blocked putting into a full local queue: keep emptying it
            _return_pulled_tasks(sentinel)
            sentinel.pusher.join(0.1)
        _return_pulled_tasks(sentinel)
        workers = list(sentinel.pool)
        for worker in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, signal.SIGUSR1)
        deadline = threading.Timer(settings.Q_STOP_GRACE_SECONDS, _terminate_busy, args=(workers,))
        deadline.daemon = True
        deadline.start()
        stop(sentinel)  # django-q2's own stop: poison pills, wait for the workers and the monitor
        deadline.cancel()

    stop_handing_back.hands_back = True
    return stop_handing_back


def _return_pulled_tasks(sentinel) -> None:
    from django_q.brokers.orm import ORM
    from django_q.signing import SignedPackage

    while True:
        try:
            task = sentinel.task_queue.get(timeout=0.05)
        except queue.Empty:
            return
        if isinstance(sentinel.broker, ORM):  # the row is still there, locked for `retry` seconds: unlock it
            sentinel.broker.get_connection().filter(pk=task["ack_id"]).update(lock=timezone.now())
        else:  # Redis popped it: push it back
            sentinel.broker.enqueue(SignedPackage.dumps(task))
        logger.info("Handed task %s back to the broker", task.get("name"))


def _terminate_busy(workers) -> None:
    for worker in workers:
        if worker.is_alive():
            logger.warning(
                "Worker %s still busy %s s after the stop: killing it", worker.pid, settings.Q_STOP_GRACE_SECONDS
            )
            worker.kill()  # SIGTERM only asks it to stop
