from django.apps import AppConfig
from django.db.models.signals import post_migrate


class LedgerConfig(AppConfig):
    name = "ledger"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from .bootstrap import after_migrate

        post_migrate.connect(after_migrate, sender=self, dispatch_uid="ledger.after_migrate")
