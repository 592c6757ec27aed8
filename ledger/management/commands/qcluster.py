"""django-q2's `qcluster`, stopping within seconds of SIGTERM or SIGINT, whether the signal reaches
this process alone (Kubernetes, systemd's KillMode=mixed) or its whole process group (a terminal's
Ctrl-C, systemd's default).

django-q2 stops by letting each worker finish its task, and the collector's round alone runs for
minutes; the stop flag (ledger/workers/stopping.py) tells the tasks to hand their work over now. And only
this process hears the signal: a sentinel killed by a signal sent to the whole group died holding
the lock of the event this process stops it with, and the cluster hung until SIGKILL. Every process
the cluster forks starts with the two signals blocked, and follows this one's stop instead."""

import os
import signal

from django.conf import settings
from django_q.cluster import Cluster
from django_q.management.commands import qcluster

from ledger.workers.stopping import ask_to_stop

STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


class Command(qcluster.Command):
    help = "Starts the workers (a django-q2 cluster); SIGTERM or SIGINT stops them within seconds."

    def handle(self, *args, **options):
        settings.SECRET_KEY  # noqa: B018 (as django-q2's command: no cluster without a signing key)
        if options.get("cluster_name"):
            os.environ["Q_CLUSTER_NAME"] = options["cluster_name"]
        # Blocked before the sentinel is forked (its processes inherit the mask); a signal that
        # arrives while the cluster starts is handled once it has started.
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        cluster = Cluster()

        def stop(signum, frame) -> None:
            ask_to_stop()
            cluster.sig_handler(signum, frame)

        for number in STOP_SIGNALS:
            signal.signal(number, stop)
        try:
            cluster.start()
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        if options.get("run_once"):
            cluster.stop()
