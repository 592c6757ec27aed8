from django.apps import AppConfig
from django.db.models.signals import post_migrate


class LedgerConfig(AppConfig):
    name = "ledger"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # `migrate` then `qcluster` is all a deployment does (SPEC rule 14): the collector's
        # schedule is put in place by every migrate, so no other setup command exists to forget.
        from .tasks import install_schedules

        post_migrate.connect(install_schedules, sender=self, dispatch_uid="ledger.install_schedules")
