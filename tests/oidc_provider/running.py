"""The test OpenID provider in a process of its own (`runserver` of tests/oidc_provider on a free
port, its own SQLite database), and BatchDesk's settings pointing at it as a deployment's environment
would."""

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.processes import ROOT, free_port, wait_until

CLIENT_ID = "batchdesk-test-client"
CLIENT_SECRET = "provider-test-secret-0123456789"
GROUPS_CLAIM = "directory_groups"
ROLE_GROUPS = {"catalogue_owner": ["Catalogue team"], "operator": ["Operations"], "admin": ["IT admins"]}


def rsa_key_pem() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


@dataclass
class DirectoryProvider:
    issuer: str
    env: dict
    process: subprocess.Popen

    def manage(self, *args: str) -> None:
        subprocess.run(
            [sys.executable, "-m", "django", *args],
            env=self.env,
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        )

    def person(self, username: str, **changes: str) -> None:
        """`directory_person`: e.g. person("alice", password="pw", groups="Catalogue team")."""
        flags = [f"--{name.replace('_', '-')}={value}" for name, value in changes.items()]
        self.manage("directory_person", username, *flags)

    def batchdesk_settings(self) -> dict:
        """What a deployment would set (BATCHDESK_OIDC_*), as Django settings."""
        return {
            "BATCHDESK_OIDC_ISSUER": self.issuer,
            "BATCHDESK_OIDC_CLIENT_ID": CLIENT_ID,
            "BATCHDESK_OIDC_CLIENT_SECRET": CLIENT_SECRET,
            "BATCHDESK_OIDC_GROUPS_CLAIM": GROUPS_CLAIM,
            "BATCHDESK_OIDC_ROLE_GROUPS": json.dumps(ROLE_GROUPS),
            "BATCHDESK_OIDC_NAME": "Acme Directory",
        }

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def start_provider(directory: Path, *redirect_uris: str) -> DirectoryProvider:
    port = free_port()
    issuer = f"http://127.0.0.1:{port}/o"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.oidc_provider.settings",
        "OIDC_PROVIDER_DB": str(directory / "provider.sqlite3"),
        "OIDC_PROVIDER_ISSUER": issuer,
        "OIDC_PROVIDER_RSA_KEY": rsa_key_pem(),
        "OIDC_PROVIDER_GROUPS_CLAIM": GROUPS_CLAIM,
        "PYTHONUNBUFFERED": "1",
    }
    uris = [f"--redirect-uri={uri}" for uri in redirect_uris]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "django",
            "prepare_directory",
            f"--client-id={CLIENT_ID}",
            f"--client-secret={CLIENT_SECRET}",
            *uris,
        ],
        env=env,
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    log = open(directory / "provider.log", "w")
    process = subprocess.Popen(
        [sys.executable, "-m", "django", "runserver", f"127.0.0.1:{port}", "--noreload"],
        env=env,
        cwd=ROOT,
        start_new_session=True,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    provider = DirectoryProvider(issuer=issuer, env=env, process=process)
    try:
        wait_until(lambda: answers(issuer), timeout=30, what="the test OpenID provider")
    except AssertionError:
        provider.stop()
        raise
    return provider


def answers(issuer: str) -> bool:
    try:
        return httpx.get(f"{issuer}/.well-known/openid-configuration", timeout=1).status_code == 200
    except httpx.TransportError:
        return False
