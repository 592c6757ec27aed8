from django.apps import AppConfig
from django.core import checks
from django.db.models.signals import post_migrate


class LedgerConfig(AppConfig):
    name = "ledger"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from .bootstrap import after_migrate
        from .pricing import check_price_file

        post_migrate.connect(after_migrate, sender=self, dispatch_uid="ledger.after_migrate")
        # Costs are shown everywhere: a price file that cannot be read stops every process at
        # startup (`check`, `runserver`, `migrate`, `qcluster`), never a request.
        checks.register(check_price_file, "batchdesk")
