import os
import subprocess
import sys

from django.conf import settings


def test_the_queue_redelivers_only_after_a_task_could_have_timed_out():
    # django-q2 hands an unacknowledged task out again after `retry` seconds; were that shorter
    # than `timeout`, a slow task would run twice at once.
    assert settings.Q_CLUSTER["retry"] > settings.Q_CLUSTER["timeout"]


def test_leases_outlast_a_destination_call():
    assert settings.BATCHDESK_LEASE_SECONDS > settings.BATCHDESK_WEBHOOK_TIMEOUT


def test_anthropic_results_hosts_are_read_from_the_environment():
    script = "from django.conf import settings; print(settings.PROVIDERS['anthropic']['results_hosts'])"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "batchdesk.test_settings"}
    said = {}
    for hosts in ["", "gw.example.com,dl.example.com:8443"]:
        env["ANTHROPIC_RESULTS_HOSTS"] = hosts
        run = subprocess.run(
            [sys.executable, "-c", f"import django; django.setup(); {script}"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        said[hosts] = run.stdout.strip()
    assert said == {
        "": "['']",
        "gw.example.com,dl.example.com:8443": "['gw.example.com', 'dl.example.com:8443']",
    }


def test_openai_compatible_schema_dialect_is_read_from_the_environment_and_checked():
    script = (
        "from django.conf import settings; print(settings.PROVIDERS['openai_compatible']['schema_dialect'])"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "batchdesk.test_settings"}
    env.pop("OPENAI_COMPATIBLE_SCHEMA", None)
    said = {}
    for value in [None, "as_is", "openai_strict", "gemini"]:
        if value is not None:
            env["OPENAI_COMPATIBLE_SCHEMA"] = value
        run = subprocess.run(
            [sys.executable, "-c", f"import django; django.setup(); {script}"],
            env=env,
            capture_output=True,
            text=True,
        )
        said[value] = run.stdout.strip() if run.returncode == 0 else run.stderr.strip().splitlines()[-1]
    assert said == {
        None: "openai_strict",
        "as_is": "as_is",
        "openai_strict": "openai_strict",
        "gemini": "RuntimeError: OPENAI_COMPATIBLE_SCHEMA is 'gemini': it must be openai_strict or as_is",
    }
