from django.conf import settings


def test_the_queue_redelivers_only_after_a_task_could_have_timed_out():
    # django-q2 hands an unacknowledged task out again after `retry` seconds; were that shorter
    # than `timeout`, a slow task would run twice at once.
    assert settings.Q_CLUSTER["retry"] > settings.Q_CLUSTER["timeout"]


def test_leases_outlast_a_destination_call():
    assert settings.BATCHDESK_LEASE_SECONDS > settings.BATCHDESK_WEBHOOK_TIMEOUT
